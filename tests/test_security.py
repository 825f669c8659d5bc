"""Nothing is written outside dump_path, with the dump's modes; nothing loaded from a dump can run code."""
from __future__ import annotations

import json
import os
import pickle
import stat
import threading

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import data, load

from msprobe_lite.config import ConfigError, load_config
from msprobe_lite.core import writer
from msprobe_lite.core.naming import NAME_MAX, data_file_name, safe_file_name
from msprobe_lite.pytorch import PrecisionDebugger

HOSTILE_KEYS = ["../../escaped", "a/b", "a_b", "/etc/passwd", "nul\0byte", "k" * 1000, "é" * 300, "..", ".",
                "line\nbreak", "back\\slash"]


# -- names from user code --------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_name_becomes_one_plain_file_name(name):
    safe = safe_file_name(name)
    assert "/" not in safe and "\\" not in safe and "\0" not in safe
    assert safe not in ("", ".", "..")
    assert len(safe.encode("utf-8")) <= NAME_MAX
    assert os.path.basename(safe) == safe


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=300))
def test_different_names_never_share_a_file(a, b):
    if a != b:
        assert safe_file_name(a) != safe_file_name(b)


def test_plain_names_are_unchanged_and_replaced_ones_stay_distinct():
    assert data_file_name("Module.fc1.Linear.forward.0", ("input_args", 0), ".pt") == \
        "Module.fc1.Linear.forward.0.input.0.pt"
    names = {data_file_name("Functional.linear.0.forward", ("input_kwargs", k), ".pt") for k in HOSTILE_KEYS}
    assert len(names) == len(HOSTILE_KEYS)


class Hostile(torch.nn.Module):
    """Takes a dict whose keys are hostile file names; holds a submodule whose name contains a separator."""

    def __init__(self):
        super().__init__()
        self.add_module("a/b", torch.nn.Linear(3, 3))

    def forward(self, x, extra):
        return getattr(self, "a/b")(x) + sum(extra.values())


def test_hostile_names_stay_inside_the_tensor_folder_and_unique(tmp_path):
    dump = tmp_path / "inner" / "dump"
    model = Hostile()
    extra = {k: torch.full((3,), float(i)) for i, k in enumerate(HOSTILE_KEYS)}
    d = PrecisionDebugger(dump_path=str(dump), level="mix", task="tensor")
    d.start(model=model)
    model(torch.ones(2, 3), extra=extra).sum().backward()
    d.stop()
    d.step()

    everything = {os.path.relpath(os.path.join(root, f), tmp_path) for root, _, files in os.walk(tmp_path)
                  for f in files}
    assert everything and all(p.startswith(os.path.join("inner", "dump") + os.sep) for p in everything)
    records = data(dump)
    names = [t["data_name"] for t in _tensors(records)]
    folder = load(dump)["dump_data_dir"]
    assert len(set(names)) == len(names)            # one file per place, none overwritten by another key
    for name in names:
        assert os.path.basename(name) == name and len(name.encode()) <= 255
        assert torch.load(os.path.join(folder, name), weights_only=True).shape is not None
    kwargs = records["Module.a/b.Linear.forward.0"]["input_args"]
    assert kwargs  # the module named with a separator is recorded under its own name


def _tensors(value):
    if isinstance(value, dict):
        if "data_name" in value:
            yield value
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list):
        for v in value:
            yield from _tensors(v)


def test_save_names_with_separators_stay_inside(tmp_path):
    dump = tmp_path / "dump"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "tensor", "level": "debug", "dump_path": str(dump)}))
    d = PrecisionDebugger(str(cfg))
    d.start()
    d.save(torch.ones(2), "../../escape")
    d.stop()
    d.step()
    assert sorted(os.listdir(tmp_path)) == ["c.json", "dump"]
    entry = load(dump, name="debug.json")["data"]["../../escape.0.debug"]
    assert os.path.isfile(os.path.join(dump, "step0", "rank", "dump_tensor_data", entry["data_name"]))


# -- modes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_folders_are_0750_and_files_0640_whatever_the_umask(tmp_path, umask):
    dump = tmp_path / "new" / "dump"                  # every level created by the debugger
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    old = os.umask(umask)
    try:
        d = PrecisionDebugger(dump_path=str(dump), level="L0", task="tensor")
        d.start(model=model)
        model(torch.ones(1, 3)).sum().backward()
        d.stop()
        d.step()
    finally:
        os.umask(old)
    for root, dirs, files in os.walk(tmp_path / "new"):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o750, root
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(root, f)).st_mode) == 0o640, f
    assert any(f.endswith(".pt") for _, _, files in os.walk(dump) for f in files)


# -- where the dump goes ----------------------------------------------------------------------------------------
def test_dump_path_that_is_a_symlink_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "dump"
    link.symlink_to(elsewhere)
    for given_path in (str(link), str(link) + "/"):
        with pytest.raises(ConfigError) as error:
            PrecisionDebugger(dump_path=given_path)
        assert "symbolic link" in str(error.value) and str(elsewhere) in str(error.value)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="symbolic link"):
        load_config(dump_path=str(dangling))
    assert os.listdir(elsewhere) == []


def test_dump_path_that_is_a_file_or_holds_nul_is_refused(tmp_path):
    existing = tmp_path / "file"
    existing.write_text("x")
    with pytest.raises(ConfigError, match="existing file"):
        PrecisionDebugger(dump_path=str(existing))
    with pytest.raises(ConfigError, match="NUL"):
        PrecisionDebugger(dump_path=str(tmp_path / "a\0b"))
    assert existing.read_text() == "x"


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("precious")
    target = tmp_path / "dump.json"
    tmp = f"{target}.tmp-{os.getpid()}-{threading.get_ident()}"
    os.symlink(outside, tmp)
    writer.write_atomic(str(target), "{}")
    assert outside.read_text() == "precious" and target.read_text() == "{}"
    assert sorted(os.listdir(tmp_path)) == ["dump.json", "outside"]


# -- loading ----------------------------------------------------------------------------------------------------
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))   # would create the marker file if unpickled


def _two_tensor_dumps(tmp_path):
    paths = []
    for side in ("target", "golden"):
        d = PrecisionDebugger(dump_path=str(tmp_path / side), level="L1", task="tensor")
        d.start()
        torch.exp(torch.ones(3))
        d.stop()
        d.step()
        paths.append(tmp_path / side)
    return paths


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_compare_never_unpickles_a_planted_object(tmp_path):
    from msprobe_lite.compare.api import CompareError, compare

    target, golden = _two_tensor_dumps(tmp_path)
    marker = tmp_path / "pwned"
    folder = target / "step0" / "rank" / "dump_tensor_data"
    for name in os.listdir(folder):
        with open(folder / name, "wb") as f:
            pickle.dump(_Payload(str(marker)), f)
    try:
        compare(str(target), str(golden), str(tmp_path / "out"))
    except CompareError as exc:
        assert "dump_tensor_data" in str(exc)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_numpy_files_are_loaded_without_pickle(tmp_path):
    import numpy as np
    from msprobe_lite.compare.api import CompareError, compare

    target, golden = _two_tensor_dumps(tmp_path)
    marker = tmp_path / "pwned"
    rank = target / "step0" / "rank"
    text = (rank / "dump.json").read_text()
    for name in os.listdir(rank / "dump_tensor_data"):   # the dump now names .npy files holding objects
        stem = name[:-len(".pt")]
        np.save(rank / "dump_tensor_data" / f"{stem}.npy", np.array([_Payload(str(marker))], dtype=object),
                allow_pickle=True)
        text = text.replace(f'"{name}"', f'"{stem}.npy"')
    (rank / "dump.json").write_text(text)
    try:
        compare(str(target), str(golden), str(tmp_path / "out"))
    except CompareError as exc:
        assert ".npy" in str(exc)
    assert not marker.exists()


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised():
    from msprobe_lite.compare.report import cell

    for text in ("=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert cell(text).startswith("'")
    assert cell("Functional.linear.0.forward") == "Functional.linear.0.forward"
    assert cell(-1.5) == -1.5


def test_compare_refuses_tensor_names_that_leave_the_tensor_folder(tmp_path):
    """A dump.json is input: its data_name must not point compare at files outside the dump. Every row is
    made through rows.Row, which refuses such a name; tensors.tensor_path then joins only checked names."""
    from msprobe_lite.compare import tensors
    from msprobe_lite.compare.rows import RowError, record_rows

    class Dump:
        path, data_dir = str(tmp_path / "dump.json"), str(tmp_path / "dump_tensor_data")

    def record(data_name):
        return {"output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
                            "Mean": 0.5, "Norm": 1.0, "data_name": data_name}]}

    for bad in ("../../etc/passwd", "/etc/passwd", "a/b.npy", "..", "x\\y.npy", "a\0.npy"):
        with pytest.raises(RowError, match="expected a plain file name"):
            record_rows("Functional.relu.0.forward", record(bad))
    good = "Functional.relu.0.forward.output.0.npy"
    assert record_rows("Functional.relu.0.forward", record(good))[0].obj["data_name"] == good
    assert tensors.tensor_path(Dump, good).startswith(Dump.data_dir)


def test_compare_outputs_are_complete_files_with_mode_0640(tmp_path):
    from msprobe_lite.compare import compare
    from msprobe_lite.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), task="statistics", level="L1")
    debugger.start()
    torch.ones(3).exp()
    debugger.stop()
    debugger.step()
    summary = compare(str(tmp_path / "d"), str(tmp_path / "d"), str(tmp_path / "out"), quiet=True)
    assert summary.files
    for path in summary.files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640, path
    assert not [n for n in os.listdir(tmp_path / "out") if ".partial" in n or ".tmp" in n]
