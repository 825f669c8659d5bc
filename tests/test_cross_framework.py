"""MindSpore against PyTorch: the same network in both frameworks, PyTorch weights converted into MindSpore,
both dumped, compared. Every record pairs and passes; a deliberately different layer is named first. Also
the checkpoint converter and the weight-file comparison."""
from __future__ import annotations

import json
import math
import re
import os
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
import torch  # noqa: E402
from mindspore import mint, nn  # noqa: E402

from msprobe_lite.cli import main as cli  # noqa: E402
from msprobe_lite.compare import compare  # noqa: E402
from msprobe_lite.mindspore.checkpoint import convert_checkpoint, load_into  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import demo_mindspore as demo  # noqa: E402  (the paired networks of the MindSpore demo)
from demo_mindspore import MsCNN, MsMLP, TorchCNN, TorchMLP  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)


def dump_both(tmp_path, kind, level="L0", **ms_kwargs):
    ms_step, pt_step = demo.dump_both(kind, str(tmp_path), level, **ms_kwargs)
    return ms_step, pt_step


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("direction", ["ms_target", "pt_target"])
def test_same_network_in_both_frameworks_pairs_and_passes(tmp_path, kind, direction):
    ms_dump, pt_dump = dump_both(tmp_path, kind)
    target, golden = (ms_dump, pt_dump) if direction == "ms_target" else (pt_dump, ms_dump)
    summary = compare(str(target), str(golden), str(tmp_path / "out"), quiet=True)
    pair = summary.pairs[0]
    counts = pair["counts"]
    assert counts["unmatched_target"] == counts["unmatched_golden"] == 0, counts
    assert counts["error"] == counts["warning"] == 0, (counts, pair["first_divergence"])
    n_records = len(json.load(open(os.path.join(ms_dump, "rank", "dump.json")))["data"])
    assert counts["pass"] == n_records and n_records >= 8   # forward, backward, parameter gradients


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_api_levels_pair_across_frameworks_without_warnings(tmp_path, level):
    """The same network: no call is a warning. A scalar argument that one framework's API passes and the
    other's does not (F.relu's inplace, cross_entropy's settings by position or by keyword) stays an
    unmatched row; it made the call a warning (a new user's trial: "3 warning" for an identical port)."""
    ms_dump, pt_dump = dump_both(tmp_path, "mlp", level=level)
    summary = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True)
    counts = summary.pairs[0]["counts"]
    assert counts["error"] == counts["warning"] == 0 and counts["pass"] >= (12 if level == "mix" else 4), counts
    assert summary.pairs[0]["first_divergence"] is None


def test_a_different_layer_is_named_as_first_divergence(tmp_path):
    ms_dump, pt_dump = dump_both(tmp_path, "mlp", norm_eps=1e-2)   # LayerNorm epsilon 1e-2, PyTorch's 1e-5
    summary = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True)
    first = summary.pairs[0]["first_divergence"]
    assert first is not None and first["name"] == "Cell.norm.LayerNorm.forward.0", first
    assert first["golden_name"] == "Module.norm.LayerNorm.forward.0"


def test_a_replaced_layer_is_named_at_mix_though_api_calls_do_not_all_pair(tmp_path):
    """GELU in the MindSpore port where PyTorch has ReLU, at mix: the answer named the first primitive that
    does not pair across frameworks (routine at L1) and never the GELU (a trial). Now the gelu call, alone
    where PyTorch's relu is alone (compare/runs.py), is read against it and named as the divergence."""
    ms_dump, pt_dump = dump_both(tmp_path, "mlp", level="mix", act=nn.GELU())
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]
    first = pair["first_divergence"]
    assert first["name"] == "Functional.gelu.0.forward" and first["golden_name"] == "Functional.relu.0.forward"


def test_checkpoint_conversion_and_weight_comparison(tmp_path, capsys):
    torch.manual_seed(0)
    tnet = TorchCNN()
    torch.save(tnet.state_dict(), tmp_path / "model.pt")
    template = MsCNN()
    ms.save_checkpoint(template, str(tmp_path / "template.ckpt"))
    report = convert_checkpoint(str(tmp_path / "model.pt"), str(tmp_path / "model.ckpt"), str(tmp_path / "template.ckpt"))
    assert report.complete and not report.unused, report.lines()
    assert ("bn.gamma", "bn.weight") in report.converted and ("bn.moving_mean", "bn.running_mean") in report.converted
    loaded = ms.load_checkpoint(str(tmp_path / "model.ckpt"))
    assert np.array_equal(loaded["bn.moving_variance"].asnumpy(), tnet.bn.running_var.numpy())
    assert np.array_equal(loaded["head.weight"].asnumpy(), tnet.head.weight.detach().numpy())
    direct = MsCNN()  # the in-memory route gives the same weights
    assert load_into(direct, tnet.state_dict()).complete
    assert np.array_equal(direct.bn.gamma.asnumpy(), tnet.bn.weight.detach().numpy())
    # the two files agree parameter by parameter, through the name mapping
    assert cli(["ckpt", "compare", str(tmp_path / "model.pt"), str(tmp_path / "model.ckpt")]) == 0
    assert "7 equal" in capsys.readouterr().out
    # a changed weight is found and named
    state = tnet.state_dict()
    state["conv.weight"] = state["conv.weight"] * 1.01
    torch.save(state, tmp_path / "changed.pt")
    assert cli(["ckpt", "compare", str(tmp_path / "changed.pt"), str(tmp_path / "model.ckpt")]) == 1
    out = capsys.readouterr().out
    assert "differs         conv.weight" in out


def test_conversion_reports_missing_and_mismatched_parameters(tmp_path, capsys):
    torch.manual_seed(0)
    state = TorchMLP().state_dict()
    state["fc2.weight"] = state["fc2.weight"][:, :8]     # wrong shape
    del state["fc1.bias"]                                # missing
    state["extra.weight"] = torch.zeros(2)               # unused
    torch.save(state, tmp_path / "bad.pt")
    ms.save_checkpoint(MsMLP(), str(tmp_path / "template.ckpt"))
    code = cli(["ckpt", "convert", "-i", str(tmp_path / "bad.pt"), "-o", str(tmp_path / "out.ckpt"),
                "-t", str(tmp_path / "template.ckpt")])
    out = capsys.readouterr().out
    assert code == 1
    assert "no PyTorch source for fc1.bias" in out and "shape mismatch: fc2.weight (4, 16)" in out
    assert "unused PyTorch entry extra.weight" in out
    assert cli(["ckpt", "compare", str(tmp_path / "nope.pt"), str(tmp_path / "bad.pt")]) == 2


def _paired_records(result_file) -> dict:
    """{target record: golden record} from a compare's CSV (its rows name the tensors of both)."""
    import csv
    import re

    record = re.compile(r"\.(input|output|parameters)(\.|$).*")
    with open(result_file, newline="") as f:
        return {record.sub("", row["NPU Name"]): record.sub("", row["Bench Name"]) for row in csv.DictReader(f)
                if row["NPU Name"] not in ("", "N/A") and row["Bench Name"] not in ("", "N/A")}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_one_operation_pairs_whatever_namespace_each_framework_reaches_it_through(tmp_path, level):
    """PyTorch's `q @ k` is Tensor.matmul and `torch.softmax` Torch.softmax; MindSpore's ops.matmul and
    ops.softmax map to Torch.matmul and Functional.softmax: the whole attention core stayed unmatched on
    both sides (a new user's trial, "59 unmatched in target, 42 in golden" for a clean port)."""
    ms_dump, pt_dump = dump_both(tmp_path, "attention", level=level)
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]
    counts = pair["counts"]
    assert counts["unmatched_target"] == counts["unmatched_golden"] == counts["error"] == counts["warning"] == 0
    paired = _paired_records(pair["result_file"])
    assert paired["Functional.matmul.0.forward"] == "Tensor.matmul.0.forward"
    assert paired["Functional.softmax.0.forward"] == "Torch.softmax.0.forward"
    assert paired["Functional.chunk.0.forward"] == "Tensor.chunk.0.forward"
    assert paired["Tensor.__pow__.0.forward"] == "Tensor.__pow__.0.forward"   # the loss's `** 2`


def test_an_operation_the_port_left_out_is_named_across_frameworks(tmp_path):
    """The attention scale left out of the MindSpore port: the golden's `Tensor.div` sits between a matmul and a
    softmax that both paired, and the port went from one to the other. It was never named across frameworks
    (API calls that do not pair are routine there: nn.Dense is MatMul and BiasAdd); a call only in the golden
    is named when the target made nothing in its place."""
    ms_dump, pt_dump = dump_both(tmp_path, "attention", level="L1", scaled=False)
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]
    missing = pair["first_only_in_golden"]
    assert missing is not None and missing["name"] == "Tensor.div.0.forward", missing
    assert "math.sqrt(8)" in missing["stack"][0]


def _paired_rows(result_file) -> dict:
    """{target row: golden row} from a compare's CSV."""
    import csv

    with open(result_file, newline="") as f:
        return {row["NPU Name"]: row["Bench Name"] for row in csv.DictReader(f)}


def test_norm_primitives_pair_with_their_arguments_in_pytorchs_order(tmp_path):
    """MindSpore's BatchNorm returns five outputs and LayerNorm three where PyTorch's return one: they never
    paired at L1, so a wrong LayerNorm epsilon could not be found there (a new user's trial). They pair on
    their first output now, the batch statistics beside it are the target's own (no warning), and their
    arguments meet in PyTorch's order: BatchNorm's scale is batch_norm's weight (input.3), not its
    running_mean (input.1), and so are their gradients in the backward record."""
    ms_dump, pt_dump = dump_both(tmp_path / "cnn", "cnn", level="L1")
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]
    assert pair["counts"]["error"] == pair["counts"]["warning"] == 0 and pair["first_divergence"] is None, pair
    rows = _paired_rows(pair["result_file"])
    forward, backward = "Primitive.BatchNorm.0.forward", "Primitive.BatchNorm.0.backward"
    # nn.BatchNorm2d passes weight and bias to F.batch_norm by keyword: they meet MindSpore's scale and bias
    assert rows[f"{forward}.input.1"] == "Functional.batch_norm.0.forward.input.weight"
    assert rows[f"{forward}.input.3"] == "Functional.batch_norm.0.forward.input.1"    # mean: running_mean
    assert rows[f"{forward}.output.0"] == "Functional.batch_norm.0.forward.output.0"
    assert rows[f"{backward}.output.1"] == "Functional.batch_norm.0.backward.output.3"  # d scale: d weight
    reverse = compare(str(pt_dump), str(ms_dump), str(tmp_path / "reverse"), quiet=True).pairs[0]
    assert reverse["counts"]["error"] == reverse["counts"]["warning"] == 0, reverse
    assert _paired_rows(reverse["result_file"])["Functional.batch_norm.0.forward.input.weight"] == f"{forward}.input.1"
    ms_dump, pt_dump = dump_both(tmp_path / "mlp", "mlp", level="L1")
    rows = _paired_rows(compare(str(ms_dump), str(pt_dump), str(tmp_path / "out2"), quiet=True)
                        .pairs[0]["result_file"])
    assert rows["Primitive.LayerNorm.0.forward.input.1"] == "Functional.layer_norm.0.forward.input.weight"  # gamma
    assert rows["Primitive.LayerNorm.0.backward.output.1"] == "Functional.layer_norm.0.backward.output.1"


def test_a_different_epsilon_is_named_at_L1(tmp_path):
    ms_dump, pt_dump = dump_both(tmp_path, "mlp", level="L1", norm_eps=1e-2)
    first = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]["first_divergence"]
    assert first is not None and first["name"] == "Primitive.LayerNorm.0.forward", first
    assert first["golden_name"] == "Functional.layer_norm.0.forward"


def test_a_mapping_fragment_written_as_a_module_for_a_mindspore_target_gets_the_cell_name(tmp_path):
    """A PyTorch user writes `Module.fc1` for a MindSpore target, whose records are `Cell.fc1...`: no hint came
    (a new user's trial)."""
    ms_dump, pt_dump = dump_both(tmp_path, "mlp")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("Module.fc1: Module.fc1\n")
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), mapping=str(mapping), quiet=True).pairs[0]
    assert pair["mapping_unused"] == ["Module.fc1"] and pair["mapping_close"] == {"Module.fc1": "Cell.fc1"}


def test_a_dtype_argument_is_the_same_in_both_spellings():
    """`x.astype(ms.float32)` against `x.to(torch.float32)`: 'Float32' and 'torch.float32' read as a setting
    that differs, and once the inputs drifted the cast was named as the first divergence (a review)."""
    from msprobe_lite.compare.judge import scalar_value

    assert scalar_value({"type": "mindspore.dtype", "value": "Float32"}) == scalar_value({"type": "torch.dtype",
                                                                            "value": "torch.float32"})
    assert scalar_value({"type": "mindspore.dtype", "value": "Float16"}) != scalar_value({"type": "torch.dtype",
                                                                            "value": "torch.float32"})


class _TorchAttentionWithCopies(demo.TorchAttention):
    """PyTorch attention as it is often written: `.contiguous()` after the transpose, a dropout (off in eval)."""

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        att = torch.softmax(q @ k.transpose(-2, -1).contiguous() / math.sqrt(8), dim=-1)
        return self.out(torch.nn.functional.dropout(att, 0.1, training=False) @ v)


def test_a_copy_the_port_does_not_make_is_not_named_as_left_out(tmp_path, monkeypatch):
    """`.contiguous()` (and dropout in eval, `.clone()`, a view) has no MindSpore counterpart in the port, and
    the gap rule named it as "a call only in the golden" in a clean port (a review). A call whose outputs have
    its inputs' statistics changes no value: not named."""
    torch_cls, ms_cls, shape = demo.NETWORKS["attention"]
    monkeypatch.setitem(demo.NETWORKS, "attention", (_TorchAttentionWithCopies, ms_cls, shape))
    ms_dump, pt_dump = dump_both(tmp_path / "clean", "attention", level="L1")
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs[0]
    assert pair["first_only_in_golden"] is None and pair["first_divergence"] is None, pair
    assert pair["counts"]["unmatched_golden"] >= 2   # the copies are listed, not named
    ms_dump, pt_dump = dump_both(tmp_path / "bug", "attention", level="L1", scaled=False)
    pair = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out2"), quiet=True).pairs[0]
    assert pair["first_only_in_golden"]["name"] == "Tensor.div.0.forward"


def test_an_argument_passed_by_keyword_meets_its_position_on_both_sides():
    """PyTorch's keywords table made F.layer_norm's `weight=` position 2 on the PyTorch side only: a MindSpore
    `mint.nn.functional.layer_norm(x, s, weight=w)` kept `.input.weight` and the two never met (a review)."""
    from msprobe_lite.compare.frameworks import Translation

    names = Translation()
    torch_side = {names.torch_row_tail(t, "Functional.layer_norm.0.forward") for t in (".input.weight", ".input.2")}
    assert torch_side == {".input.2"}
    assert names.row_tail(".input.weight", "MintFunctional.layer_norm.0.forward") == ".input.2"
    assert names.row_tail(".input.1", "Primitive.LayerNorm.0.forward") == ".input.2"   # gamma, by position
    assert names.row_tail(".input.axis", "Functional.softmax.0.forward") == ".input.dim"


@pytest.mark.parametrize("text,expected", [("positions: {Primitive.BatchNorm: [0, -1]}", "lists of argument positions"),
                                           ("keywords: {Functional.batch_norm: {weight: x}}", "argument name -> position"),
                                           ("apis: {Primitive.Dense: 3}", "names (strings)")])
def test_a_mapping_file_with_a_bad_section_is_named(tmp_path, text, expected):
    from msprobe_lite.compare.frameworks import NameMapError, load_names

    path = tmp_path / "map.yaml"
    path.write_text(text + "\n")
    with pytest.raises(NameMapError, match=re.escape(f"{path}:") + " section '.*' must map names to .*"
                       + re.escape(expected)):
        load_names(str(path))



class _PtBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _PtBlockNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = _PtBlock(), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(x))


class _MsBlock(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = mint.nn.Linear(8, 16), nn.ReLU(), mint.nn.Linear(16, 8)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


class _MsBlockNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block, self.head = _MsBlock(), mint.nn.Linear(8, 4)

    def construct(self, x):
        return self.head(self.block(x))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_cells_and_modules_pair_by_path_whatever_their_classes_are_named(tmp_path, level, monkeypatch):
    """A port names its classes its own way (`_MsBlock` for `_PtBlock`): the records under them pair by path
    without a mapping, and the answer says the classes differ, as information."""
    monkeypatch.setitem(demo.NETWORKS, "blocks", (_PtBlockNet, _MsBlockNet, (4, 8)))
    ms_dump, pt_dump = dump_both(tmp_path, "blocks", level=level)
    for target, golden, classes in ((ms_dump, pt_dump, "_MsBlock / _PtBlock"), (pt_dump, ms_dump, "_PtBlock / _MsBlock")):
        (p,) = compare(str(target), str(golden), str(tmp_path / "out"), quiet=True).pairs
        c = p["counts"]
        assert c["unmatched_target"] == c["unmatched_golden"] == c["error"] == c["warning"] == 0, c
        assert p["note"] == f"paired by path, classes named differently: block ({classes})"


def test_md5_is_not_judged_across_frameworks(tmp_path):
    """Dumps with summary_mode md5 of one port: no two frameworks' kernels agree bit for bit, so every row
    read "md5 differ" (76 errors on a clean port). Said once, and judged by the statistics the dumps hold."""
    from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger
    from msprobe_lite.pytorch import PrecisionDebugger as PtDebugger

    tnet, mnet, x, _ = demo.converted_pair("mlp", str(tmp_path / "weights"))
    steps = []
    for name, debugger_class in (("pytorch", PtDebugger), ("mindspore", MsDebugger)):
        config = tmp_path / f"{name}.json"
        config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / name),
                                      "statistics": {"summary_mode": "md5"}}))
        debugger = debugger_class(str(config))
        if name == "pytorch":
            debugger.start(tnet)
            (tnet(torch.from_numpy(x)) ** 2).mean().backward()
        else:
            debugger.start(mnet)
            ms.value_and_grad(lambda inp: (mnet(inp) ** 2).mean(), None, mnet.trainable_params())(ms.Tensor(x))
        debugger.stop()
        debugger.step()
        steps.append(str(tmp_path / name / "step0"))
    assert "md5" in open(os.path.join(steps[0], "rank", "dump.json")).read()
    (p,) = compare(steps[1], steps[0], str(tmp_path / "out"), quiet=True).pairs
    assert p["note"].startswith("md5 not compared across frameworks"), p["note"]
    assert p["counts"]["error"] == p["counts"]["warning"] == 0 and p["counts"]["pass"] >= 8, p["counts"]


class _PtTransposed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.transpose(1, 2))


class _MsTransposed(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = mint.nn.Linear(4, 3)

    def construct(self, x):
        return self.fc(x.transpose(0, 2, 1))  # MindSpore's transpose takes the whole permutation


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_mindsporess_transpose_by_permutation_is_pytorchs_two_axis_transpose(tmp_path, level, monkeypatch):
    """`x.transpose(0, 2, 1)` in MindSpore is `x.transpose(1, 2)` in PyTorch: paired, and their axis arguments
    (a permutation, two axes) are no difference ("argument input.1 differs: target 0, golden 1" on a clean port)."""
    monkeypatch.setitem(demo.NETWORKS, "transposed", (_PtTransposed, _MsTransposed, (2, 4, 5)))
    ms_dump, pt_dump = dump_both(tmp_path, "transposed", level=level)
    (p,) = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs
    assert p["counts"]["error"] == p["counts"]["warning"] == 0, (p["counts"], p["first_warning"])
    assert "Tensor.transpose.0.forward" in open(p["result_file"]).read()


class _PtBiasedCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.relu, self.head = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Linear(64, 3)

    def forward(self, x):
        h = self.relu(self.conv(x))
        return self.head(h.reshape(h.shape[0], -1))


class _MsBiasedCNN(nn.Cell):
    """nn.Conv2d with a bias runs Conv2D then BiasAdd, nn.Dense MatMul then BiasAdd: PyTorch runs one call."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.relu, self.head = nn.ReLU(), nn.Dense(64, 3)

    def construct(self, x):
        h = self.relu(self.conv(x))
        return self.head(h.reshape(h.shape[0], -1))


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("fault", [False, True])
def test_one_pytorch_call_pairs_with_the_run_of_mindspore_primitives_that_makes_it(tmp_path, level, fault,
                                                                                   monkeypatch):
    """A clean port pairs every call (conv2d with Conv2D + BiasAdd, linear with MatMul + BiasAdd: the run's
    first inputs and last outputs); a bias that the port doubled names that run's call, in either direction.
    After the divergence a run whose first input differs from the call's is not joined (the backward here)."""
    from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger
    from msprobe_lite.pytorch import PrecisionDebugger as PtDebugger

    monkeypatch.setitem(demo.NETWORKS, "biased", (_PtBiasedCNN, _MsBiasedCNN, (2, 3, 4, 4)))
    tnet, mnet, x, _ = demo.converted_pair("biased", str(tmp_path / "weights"))
    if fault:
        mnet.conv.bias.set_data(mnet.conv.bias * 2)
    debugger = PtDebugger(dump_path=str(tmp_path / "pt"), task="statistics", level=level)
    debugger.start(tnet)
    (tnet(torch.from_numpy(x)) ** 2).mean().backward()
    debugger.stop()
    debugger.step()
    debugger = MsDebugger(dump_path=str(tmp_path / "ms"), task="statistics", level=level)
    debugger.start(mnet)
    ms.value_and_grad(lambda inp: (mnet(inp) ** 2).mean(), None, mnet.trainable_params())(ms.Tensor(x))
    debugger.stop()
    debugger.step()
    for target, golden in ((tmp_path / "ms" / "step0", tmp_path / "pt" / "step0"),
                           (tmp_path / "pt" / "step0", tmp_path / "ms" / "step0")):
        (p,) = compare(str(target), str(golden), str(tmp_path / "out"), quiet=True).pairs
        first = p["first_divergence"] or p["first_seen"]
        if not fault:  # (after a divergence a run's inputs differ from the call's, and it is not joined)
            assert p["counts"]["unmatched_target"] == p["counts"]["unmatched_golden"] == 0, p["counts"]
            assert first is None and p["counts"]["error"] == p["counts"]["warning"] == 0, (p["counts"], first)
        else:
            assert first["name"] in ("Primitive.Conv2D.0.forward", "Functional.conv2d.0.forward"), first


def _train_both(tmp_path, level, steps, ms_optimizer, pt_optimizer):
    """The demo MLP converted to MindSpore, trained `steps` steps on each side (optimizers made by the two
    callables from the parameters), the optimizer's update outside the dumped window; (MindSpore, PyTorch) dumps."""
    from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger
    from msprobe_lite.pytorch import PrecisionDebugger as PtDebugger

    tnet, mnet, x, _ = demo.converted_pair("mlp", str(tmp_path / "weights"))
    opt = pt_optimizer(tnet.parameters())
    debugger = PtDebugger(dump_path=str(tmp_path / "pt"), task="statistics", level=level)
    for _ in range(steps):
        debugger.start(tnet)
        (tnet(torch.from_numpy(x)) ** 2).mean().backward()
        debugger.stop()
        opt.step()
        opt.zero_grad()
        debugger.step()
    ms_opt = ms_optimizer(mnet.trainable_params())
    grad_fn = ms.value_and_grad(lambda inp: (mnet(inp) ** 2).mean(), None, ms_opt.parameters)
    debugger = MsDebugger(dump_path=str(tmp_path / "ms"), task="statistics", level=level)
    for _ in range(steps):
        debugger.start(mnet)
        _, grads = grad_fn(ms.Tensor(x))
        debugger.stop()
        ms_opt(grads)
        debugger.step()
    return str(tmp_path / "ms"), str(tmp_path / "pt")


def test_an_optimizer_of_another_kind_in_the_port_is_named_as_the_place(tmp_path):
    """MindSpore's AdamWeightDecay against PyTorch's Adam: step 0 agrees (forward, gradients); step 1's
    weights differ by the decay, and the answer names the update between the steps, not a layer."""
    ms_dump, pt_dump = _train_both(
        tmp_path, "L0", 2, lambda params: nn.AdamWeightDecay(params, learning_rate=1e-2, weight_decay=0.1),
        lambda params: torch.optim.Adam(params, lr=1e-2))
    step0, step1 = compare(ms_dump, pt_dump, str(tmp_path / "out"), quiet=True).pairs
    assert step0["first_divergence"] is None and step0["first_seen"] is None, step0
    found = step1["first_divergence"] or step1["first_seen"]
    assert found["place"] == "optimizer" and "the optimizer's update after step 0 differs" in found["reason"]


class _PtDropped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.drop(self.fc1(x)))


class _MsDropped(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = mint.nn.Linear(8, 16), nn.Dropout(p=0.5), mint.nn.Linear(16, 4)

    def construct(self, x):
        return self.fc2(self.drop(self.fc1(x)))


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_dropout_left_active_in_a_port_is_named_with_the_way_to_turn_it_off(tmp_path, level, monkeypatch):
    """Each framework draws its own dropout mask: the dropout is named, and the reason says how to compare
    without it (seed_all(rm_dropout=True), or eval())."""
    monkeypatch.setitem(demo.NETWORKS, "dropped", (_PtDropped, _MsDropped, (4, 8)))
    ms_dump, pt_dump = dump_both(tmp_path, "dropped", level=level)
    (p,) = compare(str(ms_dump), str(pt_dump), str(tmp_path / "out"), quiet=True).pairs
    first = p["first_divergence"]
    assert "ropout" in first["name"], first
    assert "seed_all(rm_dropout=True)" in first["reason"]
