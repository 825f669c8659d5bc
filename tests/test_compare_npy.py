"""`msprobe-lite compare_npy`: two folders of .npy files (a network's outputs or gradients saved on each side,
as the porting guide's compare_npy_dir / compare_grads_dir compare them), matched by name; the numbers checked
against numpy computed here."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from msprobe_lite.cli import main as cli
from msprobe_lite.compare.npy_dirs import compare_arrays, compare_npy_dirs


def _saved_outputs_and_grads(folder, scale_fc2=1.0):
    """A real PyTorch MLP's layer outputs and gradients saved as .npy (what a user's ts.save-style hooks write);
    `scale_fc2` changes fc2's weight, as a porting bug would."""
    torch.manual_seed(0)
    fc1, fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    with torch.no_grad():
        fc2.weight.mul_(scale_fc2)
    x = torch.from_numpy(np.random.RandomState(0).standard_normal((4, 8)).astype(np.float32))
    h = torch.relu(fc1(x))
    out = fc2(h)
    (out ** 2).mean().backward()
    folder.mkdir()
    saved = (("fc1", h), ("fc2", out), ("fc1.weight.grad", fc1.weight.grad), ("fc2.weight.grad", fc2.weight.grad))
    for name, value in saved:
        np.save(folder / f"{name}.npy", value.detach().numpy())
    return {"fc1": h.detach().numpy(), "fc2": out.detach().numpy()}


def test_the_same_network_saved_twice_is_allclose_everywhere(tmp_path, capsys):
    _saved_outputs_and_grads(tmp_path / "pt")
    _saved_outputs_and_grads(tmp_path / "ms")
    assert cli(["compare_npy", "-tp", str(tmp_path / "ms"), "-gp", str(tmp_path / "pt")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "4 allclose (rtol 0.0001, atol 0.0001)"
    assert "allclose        fc2 (4, 4)  within tolerance 100.00%  cosine 1.000000000  max|diff| 0  max rel 0" in out


def test_a_changed_layer_is_found_with_its_measures(tmp_path, capsys):
    golden = _saved_outputs_and_grads(tmp_path / "pt")
    target = _saved_outputs_and_grads(tmp_path / "ms", scale_fc2=1.01)
    rows = {r.name: r for r in compare_npy_dirs(str(tmp_path / "ms"), str(tmp_path / "pt"))}
    assert rows["fc1"].allclose and not rows["fc2"].allclose and not rows["fc1.weight.grad"].allclose
    t, g = target["fc2"].astype(np.float64), golden["fc2"].astype(np.float64)
    assert rows["fc2"].max_abs == pytest.approx(np.abs(t - g).max(), rel=1e-12)
    assert rows["fc2"].max_rel == pytest.approx((np.abs(t - g) / np.abs(g)).max(), rel=1e-9)
    cosine = (t.ravel() @ g.ravel()) / np.linalg.norm(t) / np.linalg.norm(g)
    assert rows["fc2"].cosine == pytest.approx(cosine, abs=1e-12)
    assert rows["fc2"].close_ratio == pytest.approx(np.isclose(t, g, rtol=1e-4, atol=1e-4).mean())
    assert cli(["compare_npy", "-tp", str(tmp_path / "ms"), "-gp", str(tmp_path / "pt")]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "1 allclose, 3 differs (rtol 0.0001, atol 0.0001)"
    # a looser tolerance accepts it
    assert cli(["compare_npy", "-tp", str(tmp_path / "ms"), "-gp", str(tmp_path / "pt"), "--rtol", "0.05"]) == 0


def test_unpaired_files_and_shape_mismatches_are_listed(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    np.save(tmp_path / "a" / "x.npy", np.zeros((2, 3)))
    np.save(tmp_path / "b" / "x.npy", np.zeros((3, 2)))
    np.save(tmp_path / "a" / "only_a.npy", np.zeros(2))
    np.save(tmp_path / "b" / "only_b.npy", np.zeros(2))
    assert cli(["compare_npy", "-tp", str(tmp_path / "a"), "-gp", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert "shape mismatch  x target (2, 3), golden (3, 2)" in out and "only in golden  only_b (2,)" in out
    assert "only in target  only_a (2,)" in out


def test_an_unreadable_file_is_its_own_line_and_the_others_are_compared(tmp_path, capsys):
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        np.save(tmp_path / side / "good.npy", np.ones(3))
    (tmp_path / "a" / "bad.npy").write_text("not numpy")
    np.save(tmp_path / "b" / "bad.npy", np.ones(3))
    assert cli(["compare_npy", "-tp", str(tmp_path / "a"), "-gp", str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert f"unreadable      bad: {tmp_path / 'a' / 'bad.npy'}: not a .npy file (no .npy header)" in out
    assert "allclose        good (3,)" in out
    assert compare_arrays("n", np.array([np.nan, 1.0]), np.array([np.nan, 1.0])).allclose   # NaN where both are


@pytest.mark.parametrize("args,message", [
    (["-tp", "{t}/missing", "-gp", "{t}/b"], "{t}/missing: no such folder (expected the target folder of .npy files)"),
    (["-tp", "{t}/empty", "-gp", "{t}/b"], "{t}/empty: no .npy file in the target folder"),
    (["-tp", "{t}/b", "-gp", "{t}/b", "--atol", "-1"],
     "argument --atol: expected a finite number of at least 0, got '-1'"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    for folder in ("b", "empty"):
        (tmp_path / folder).mkdir()
    np.save(tmp_path / "b" / "x.npy", np.zeros(2))
    assert cli(["compare_npy"] + [a.format(t=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert message.format(t=tmp_path) in err and "Traceback" not in err


def test_arrays_without_numbers_are_said_and_complex_ones_compared_whole():
    records = np.zeros(3, dtype=[("a", "f4"), ("b", "i4")])
    row = compare_arrays("r", records, records)
    assert row.result == "not compared" and not row.allclose
    assert "target [('a', '<f4'), ('b', '<i4')], golden" in row.note
    assert compare_arrays("s", np.array(["x"]), np.array(["x"])).result == "not compared"
    golden = np.array([1 + 1j, 2 - 1j])
    off = compare_arrays("c", golden + 0.5j, golden)   # only the imaginary part differs
    assert off.result == "differs" and off.max_abs == pytest.approx(0.5)
    assert compare_arrays("c", golden.copy(), golden).allclose
