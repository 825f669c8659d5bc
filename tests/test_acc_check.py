"""acc_check: every API call of a tensor dump replayed in float64 on CPU and judged against its dtype's rounding.

Dumps are made with the real debugger (task tensor). A fault is planted inside one kernel with a
TorchDispatchMode (below the API the debugger records), so the recorded call's inputs are right and only its
output is off: that call must be the first failure, and a run without the fault must have none."""
from __future__ import annotations

import csv
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe_lite.acc_check import AccCheckError, acc_check
from msprobe_lite.acc_check.measure import measure_float
from msprobe_lite.acc_check.standards import STANDARDS
from msprobe_lite.cli import main
from msprobe_lite.pytorch import PrecisionDebugger

from models import TinyTransformer, make


class KernelFault(TorchDispatchMode):
    """tanh's kernel off by a relative 2e-4, or gelu's computed through float16: inside one API's kernel."""

    def __init__(self, fault):
        super().__init__()
        self.fault = fault

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.fault == "tanh" and func is torch.ops.aten.tanh.default:
            return func(*args, **kwargs) * (1 + 2e-4)
        if self.fault == "gelu_fp16" and func is torch.ops.aten.gelu.default:
            return func(args[0].half(), *args[1:], **kwargs).to(args[0].dtype)
        return func(*args, **kwargs)


def dump_transformer(path, dtype=torch.float32, fault=None, level="L1"):
    """One training forward and backward (dropout on) of the seeded transformer in `dtype`, task tensor."""
    torch.manual_seed(0)
    model = TinyTransformer().to(dtype)
    tokens = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(1))
    dbg = PrecisionDebugger(dump_path=str(path), task="tensor", level=level)
    dbg.start(model=model)
    torch.manual_seed(1)
    with KernelFault(fault):
        logits, _ = model(tokens)
        logits.float().pow(2).mean().backward()
    dbg.stop()
    dbg.step()
    return path


def dump_model(path, model, x, loss=lambda out: out.float().pow(2).mean(), **cfg):
    dbg = PrecisionDebugger(dump_path=str(path), task=cfg.pop("task", "tensor"), level=cfg.pop("level", "L1"))
    dbg.start(model=model)
    loss(model(x)).backward()
    dbg.stop()
    dbg.step()
    return path


def records(path):
    with open(os.path.join(str(path), "step0", "rank", "dump.json"), encoding="utf-8") as f:
        return json.load(f)["data"]


def tensor_file(path, name):
    return torch.load(os.path.join(str(path), "step0", "rank", "dump_tensor_data", name), weights_only=True)


def api_records(path) -> list:
    return [n for n in records(path) if not n.startswith("Module.")]


@pytest.fixture(scope="module")
def fp32_dump(tmp_path_factory):
    return dump_transformer(tmp_path_factory.mktemp("fp32") / "dump")


# -- the transformer without a fault ----------------------------------------------------------------------------
def test_every_api_of_the_transformer_replays_and_passes_at_fp32(fp32_dump, tmp_path):
    s = acc_check(str(fp32_dump), str(tmp_path / "out"), quiet=True)
    assert s["first_failure"] is None
    names = [c["name"] for c in s["calls"]]
    assert names == api_records(fp32_dump)  # every API record, in dump order, none silently missing
    assert s["counts"]["error"] == s["counts"]["warning"] == 0, [c for c in s["calls"] if c["verdict"] != "pass"]
    forward = [c for c in s["calls"] if c["name"].endswith(".forward")]
    assert forward and all(c["verdict"] == "pass" for c in forward)  # every forward call replayed, dropout too
    skipped = [c for c in s["calls"] if c["verdict"] == "skipped"]
    # backward records are skipped only where the dump holds a sum over several calls, or no gradient at all
    assert all("feeding several recorded calls" in c["reason"] or "not in the dump" in c["reason"] for c in skipped)
    assert sum(c["name"].endswith(".backward") and c["verdict"] == "pass" for c in s["calls"]) >= 40
    assert s["counts"]["skipped"] == len(skipped)


def test_measures_match_an_independent_float64_computation(fp32_dump, tmp_path):
    """The numbers of a linear call and of a linear's weight gradient, computed here from the dumped files."""
    s = acc_check(str(fp32_dump), str(tmp_path / "out"), quiet=True)
    calls = {c["name"]: c for c in s["calls"]}
    rec = records(fp32_dump)["Functional.linear.0.forward"]
    x, w, b = (tensor_file(fp32_dump, a["data_name"]).double() for a in rec["input_args"])
    want = x @ w.t() + b
    got = tensor_file(fp32_dump, rec["output"][0]["data_name"]).double()
    err = calls["Functional.linear.0.forward"]["error"]
    assert err["max_abs_err"] == pytest.approx(float((got - want).abs().max()), rel=1e-9)
    assert err["norm_rel_err"] == pytest.approx(float((got - want).norm() / want.norm()), rel=1e-9)
    assert err["dtype"] == "float32" and err["elements"] == want.numel()

    bwd = records(fp32_dump)["Functional.linear.0.backward"]
    grad_out = tensor_file(fp32_dump, bwd["input"][0]["data_name"]).double()
    want_w = grad_out.reshape(-1, grad_out.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
    got_w = tensor_file(fp32_dump, bwd["output"][1]["data_name"]).double()
    judged = calls["Functional.linear.0.backward"]["error"]
    assert judged["output"] in ("output.1", "output.2")
    if judged["output"] == "output.1":
        assert judged["max_abs_err"] == pytest.approx(float((got_w - want_w).abs().max()), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_no_false_alarm_from_normal_rounding(tmp_path, dtype):
    s = acc_check(str(dump_transformer(tmp_path / "dump", dtype)), str(tmp_path / "out"), quiet=True)
    assert s["first_failure"] is None, s["first_failure"]
    assert s["counts"]["error"] == 0
    assert s["counts"]["pass"] >= 100
    dtypes = {c["error"].get("dtype") for c in s["calls"] if c["error"].get("dtype", "").startswith(("b", "f"))}
    assert str(dtype).replace("torch.", "") in dtypes


# -- a kernel less precise than its dtype -------------------------------------------------------------------------
@pytest.mark.parametrize("fault, name, api", [("tanh", "Torch.tanh.0.forward", torch.tanh),
                                               ("gelu_fp16", "Functional.gelu.0.forward", F.gelu)])
def test_a_kernel_less_precise_than_its_dtype_is_the_first_failure(tmp_path, fault, name, api):
    dump = dump_transformer(tmp_path / "dump", fault=fault)
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    first = s["first_failure"]
    assert first is not None and first["name"] == name, first
    assert any("models.py" in frame for frame in first["stack"])
    # the error, computed here: the recorded output against the function in float64 on the recorded input
    rec = records(dump)[name]
    x = tensor_file(dump, rec["input_args"][0]["data_name"]).double()
    got = tensor_file(dump, rec["output"][0]["data_name"]).double()
    want = api(x)
    rel = float(((got - want).abs() / want.abs()).max())
    call = next(c for c in s["calls"] if c["name"] == name)
    assert call["verdict"] == "error"
    assert call["error"]["max_rel_err"] == pytest.approx(rel, rel=1e-9)
    assert rel > 1e-4  # 2e-4 planted, or float16's rounding (2 ** -11) inside a float32 call
    # every call before it passes or is skipped: its inputs were right, nothing earlier was off
    before = [c for c in s["calls"][:[c["name"] for c in s["calls"]].index(name)]]
    assert all(c["verdict"] in ("pass", "skipped") for c in before)


# -- what is skipped, and why ----------------------------------------------------------------------------------
class Misc(nn.Module):
    """A random op, uninitialised memory, indexing writes and a float32 softmax of a float32 tensor."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x).clone()
        keep = torch.bernoulli(torch.full_like(h, 0.5)).detach()
        torch.empty_like(h)
        h[:, 0] = 0.5
        h[..., :2] = h[..., :2] * 2
        values, _ = h.max(dim=1)
        return (F.softmax(h, dim=-1, dtype=torch.float32) * keep).sum() + values.sum()


def test_random_ops_and_uninitialised_memory_are_skipped_with_their_reason(tmp_path):
    torch.manual_seed(0)
    dump = dump_model(tmp_path / "dump", Misc(), torch.randn(4, 8), loss=lambda out: out)
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    calls = {c["name"]: c for c in s["calls"]}
    assert calls["Torch.bernoulli.0.forward"]["verdict"] == "skipped"
    assert "random op" in calls["Torch.bernoulli.0.forward"]["reason"]
    assert "uninitialised" in calls["Torch.empty_like.0.forward"]["reason"]
    for name in ("Tensor.__setitem__.0.forward", "Tensor.__setitem__.1.forward", "Tensor.max.0.forward",
                 "Functional.softmax.0.forward"):
        assert calls[name]["verdict"] == "pass", calls[name]
    assert calls["Tensor.max.0.forward"]["error"]["output"] == "output.0"  # values and indices both replayed
    assert s["counts"]["skipped"] == sum(c["verdict"] == "skipped" for c in s["calls"]) >= 2
    assert s["first_failure"] is None


def test_in_place_ops_and_batch_norm_in_training_replay(tmp_path):
    model, x, _ = make("cnn")
    dump = dump_model(tmp_path / "dump", model, x)
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    verdicts = {c["name"]: c["verdict"] for c in s["calls"]}
    assert verdicts["Tensor.relu_.0.forward"] == verdicts["Functional.relu.0.forward"] == "pass"
    assert verdicts["Functional.batch_norm.0.forward"] == "pass"
    assert s["counts"]["error"] == s["counts"]["warning"] == 0


def test_the_optimizers_update_in_the_dump_leaves_the_weight_gradients_judged(tmp_path):
    """optimizer.step() between start() and stop() (the README's loop): its calls take every parameter after the
    backward pass, which feeds no gradient back; the weight gradients of the layers are still judged. An output
    not judged is said in the call's reason, even when the call passes."""
    model, x, _ = make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="tensor", level="L1")
    dbg.start(model=model)
    model(x).float().pow(2).mean().backward()
    opt.step()
    dbg.stop()
    dbg.step()
    assert any(n.startswith("Tensor.add_.") for n in api_records(tmp_path / "dump"))  # the update is dumped
    s = acc_check(str(tmp_path / "dump"), str(tmp_path / "out"), quiet=True)
    linear = [c for c in s["calls"] if c["name"].startswith("Functional.linear.") and c["name"].endswith("backward")]
    assert linear and all(c["verdict"] == "pass" for c in linear), linear
    assert all(c["error"]["output"] in ("output.0", "output.1", "output.2") for c in linear)
    assert all("not judged" not in c["reason"] for c in linear)  # weight and bias gradients judged too


# -- the measures ------------------------------------------------------------------------------------------------
def test_ulp_measure_against_numpy_spacing():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000) * 3.0
    rms = math.sqrt(float(np.mean(ref * ref)))
    for dtype, name, mantissa in ((np.float32, "float32", 23), (np.float16, "float16", 10)):
        rounded = ref.astype(dtype).astype(np.float64)
        one_off = np.nextafter(ref.astype(dtype), np.inf, dtype=dtype).astype(np.float64)
        m = measure_float(rounded, ref, STANDARDS[name])
        assert m["max_ulp"] <= 0.5  # correctly rounded: at most half a ULP
        m = measure_float(one_off, ref, STANDARDS[name])
        # the ULP of the binade of max(|ref|, rms): small elements are measured at the tensor's RMS
        ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), rms))) - mantissa)
        assert m["max_ulp"] == pytest.approx(float(np.max(np.abs(one_off - ref) / ulp)), rel=1e-12)
        assert 0.5 < m["max_ulp"] <= 1.5
        assert m["max_rel_err"] == pytest.approx(float(np.max(np.abs(one_off - ref) / np.abs(ref))), rel=1e-12)


def test_nonfinite_values_match_the_dtype_and_overflow_is_an_error():
    std = STANDARDS["float16"]
    ref = np.array([1.0, 70000.0, -np.inf, np.nan])
    assert measure_float(np.array([1.0, np.inf, -np.inf, np.nan]), ref, std)["nonfinite_mismatch"] == 0
    assert measure_float(np.array([np.inf, np.inf, -np.inf, np.nan]), ref, std)["nonfinite_mismatch"] == 1


# -- command line, table, report ---------------------------------------------------------------------------------
def test_cli_answers_per_rank_and_writes_summary_and_table(tmp_path, capsys):
    dump = dump_transformer(tmp_path / "dump", fault="tanh")
    out = tmp_path / "out"
    assert main(["acc_check", "-i", str(dump / "step0" / "rank"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[step 0] first failure: Torch.tanh.0.forward" in printed
    assert all(len(line) <= 160 for line in printed.splitlines())
    summary = json.loads((out / "acc_check_summary.json").read_text())
    assert set(summary) >= {"calls", "first_failure", "counts", "ranks"}
    assert set(summary["first_failure"]) >= {"name", "reason", "stack"}
    assert all(set(c) >= {"name", "verdict", "error", "reason"} for c in summary["calls"])
    with open(out / "acc_check_result.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["Name"] for r in rows] == [c["name"] for c in summary["calls"]]
    assert next(r for r in rows if r["Name"] == "Torch.tanh.0.forward")["Verdict"] == "error"


def test_cli_refuses_a_statistics_dump_and_a_missing_path_in_one_line(tmp_path, capsys):
    model, x, _ = make("mlp")
    dump = dump_model(tmp_path / "stats", model, x, task="statistics")
    capsys.readouterr()  # the debugger's own line
    assert main(["acc_check", "-i", str(dump), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "task 'statistics'" in err and "tensor" in err and len(err.strip().splitlines()) == 1
    assert main(["acc_check", "-i", str(tmp_path / "nothing"), "-o", str(tmp_path / "o")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    with pytest.raises(AccCheckError):
        acc_check(str(tmp_path / "nothing"), str(tmp_path / "o"))


def test_section_added_to_an_existing_report_once(tmp_path, fp32_dump, capsys):
    out = tmp_path / "out"
    assert main(["compare", "-tp", str(fp32_dump), "-gp", str(fp32_dump), "-o", str(out)]) == 0
    for _ in range(2):
        acc_check(str(fp32_dump), str(out), quiet=True)
    page = (out / "report.html").read_text()
    assert page.count("<section id='acc_check'>") == 1
    assert page.index("<section id='acc_check'>") < page.index("<script>")
    assert "no call loses more precision than its dtype explains" in page
    from test_report_html import browser  # the page with the section still loads cleanly in a real browser

    dom = browser("--dump-dom", (out / "report.html").resolve().as_uri())
    assert dom.returncode == 0 and 'data-ready="1"' in dom.stdout and 'data-errors=""' in dom.stdout
    assert "acc_check: every call replayed in float64" in dom.stdout


# -- MindSpore ---------------------------------------------------------------------------------------------------
def dump_ms(path, kind="attention"):
    import ms_models
    from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger

    net, x = ms_models.make(kind)
    dbg = MsDebugger(dump_path=str(path), task="tensor", level="L1")
    dbg.start(net)
    net(x)
    dbg.stop()
    dbg.step()
    return path


def test_mindspore_forward_calls_replay_in_float64_and_pass(tmp_path):
    dump = dump_ms(tmp_path / "dump")
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    calls = {c["name"]: c for c in s["calls"]}
    assert list(calls) == list(records(dump))
    assert s["first_failure"] is None and s["counts"]["error"] == s["counts"]["warning"] == 0
    for name in ("Mint.matmul.0.forward", "Functional.softmax.0.forward", "Tensor.add.0.forward",
                 "Primitive.Dense.0.forward"):
        assert calls[name]["verdict"] == "pass", calls[name]
    assert "attributes" in calls["Primitive.LayerNorm.0.forward"]["reason"]  # made with epsilon, axes: not dumped
    # Primitive.Dense's numbers, computed here: x @ w.T + b in float64 from the dumped files
    rec = records(dump)["Primitive.Dense.0.forward"]
    folder = os.path.join(str(dump), "step0", "rank", "dump_tensor_data")
    x, w, b = (np.load(os.path.join(folder, a["data_name"])).astype(np.float64) for a in rec["input_args"])
    got = np.load(os.path.join(folder, rec["output"][0]["data_name"])).astype(np.float64)
    assert calls["Primitive.Dense.0.forward"]["error"]["max_abs_err"] == \
        pytest.approx(float(np.abs(got - (x @ w.T + b)).max()), rel=1e-9)


def test_mindspore_output_off_by_2e_4_is_the_first_failure(tmp_path):
    """A kernel that lost precision, as the dump shows it: Mint.matmul.1's saved output scaled by 1 + 2e-4."""
    dump = dump_ms(tmp_path / "dump")
    rec = records(dump)["Mint.matmul.1.forward"]
    path = os.path.join(str(dump), "step0", "rank", "dump_tensor_data", rec["output"][0]["data_name"])
    np.save(path, (np.load(path) * np.float32(1 + 2e-4)).astype(np.float32))
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    assert s["first_failure"]["name"] == "Mint.matmul.1.forward"
    assert [c["name"] for c in s["calls"] if c["verdict"] == "error"] == ["Mint.matmul.1.forward"]


def test_a_dump_of_modules_only_replays_nothing_and_says_so(tmp_path, capsys):
    model, x, _ = make("mlp")
    dump = dump_model(tmp_path / "dump", model, x, level="L0")
    capsys.readouterr()
    assert main(["acc_check", "-i", str(dump), "-o", str(tmp_path / "out")]) == 1  # no evidence either way
    assert "no API call to replay" in capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "acc_check_summary.json").read_text())
    assert summary["calls"] == [] and summary["not_calls"]["modules"] == len(records(dump)) - \
        summary["not_calls"].get("parameter_gradients", 0)


def test_a_hostile_dump_runs_nothing_outside_the_api_list_and_reads_no_file_outside(tmp_path, fp32_dump):
    """A record named after torch.save would write a file; a data_name with `..` would read one elsewhere."""
    import shutil
    dump = tmp_path / "dump"
    shutil.copytree(fp32_dump, dump)
    path = dump / "step0" / "rank" / "dump.json"
    content = json.loads(path.read_text())
    linear = content["data"]["Functional.linear.0.forward"]
    planted = tmp_path / "planted.pt"
    content["data"]["Torch.save.0.forward"] = {"input_args": [linear["input_args"][0],
                                                              {"type": "str", "value": str(planted)}],
                                               "input_kwargs": {}, "output": [linear["output"][0]]}
    outside = json.loads(json.dumps(linear))
    outside["input_args"][0]["data_name"] = "../../../../outside.pt"
    content["data"]["Functional.linear.99.forward"] = outside
    path.write_text(json.dumps(content))
    s = acc_check(str(dump), str(tmp_path / "out"), quiet=True)
    calls = {c["name"]: c for c in s["calls"]}
    assert calls["Torch.save.0.forward"]["verdict"] == "skipped" and not planted.exists()
    assert "not a computation" in calls["Torch.save.0.forward"]["reason"]
    assert calls["Functional.linear.99.forward"]["verdict"] == "skipped"
    assert "no tensor file" in calls["Functional.linear.99.forward"]["reason"]


def test_an_answer_where_most_calls_were_skipped_says_so():
    """No clean bill of health from a dump whose calls mostly could not be replayed."""
    from msprobe_lite.acc_check.run import rank_line

    calls = [{"verdict": "pass"}] * 3 + [{"verdict": "skipped"}] * 5
    result = {"calls": calls, "first_failure": None,
              "counts": {"pass": 3, "warning": 0, "error": 0, "skipped": 5}}
    line = rank_line(0, None, result)
    assert "no call loses more precision" in line and "most calls could not be replayed" in line
    result["counts"], result["calls"] = {"pass": 5, "warning": 0, "error": 0, "skipped": 3}, calls[:3] * 2 + calls[3:6]
    assert "most calls" not in rank_line(0, None, result)


def test_a_call_is_sized_on_the_meta_device_before_it_runs():
    """A hostile dump's `x.repeat(100000, 100000)` recorded with a small output: its shapes are known without
    memory, and a call whose shapes are not the recorded ones never runs."""
    from msprobe_lite.acc_check.skips import never_replayed
    from msprobe_lite.pytorch.replay import _meta_shapes

    assert _meta_shapes(torch.Tensor.repeat, "repeat", [torch.ones(2, 3), 100000, 100000], {}) == [(200000, 300000)]
    assert _meta_shapes(torch.zeros, "zeros", [10 ** 6, 10 ** 6], {"device": "cpu"}) == [(10 ** 6, 10 ** 6)]
    assert _meta_shapes(torch.nonzero, "nonzero", [torch.ones(3)], {}) is None  # values decide: run to see
    for prefix, api in (("Tensor", "set_device_address"), ("Primitive", "PyExecute"), ("Primitive", "ScalarSummary"),
                        ("Tensor", "offload_file_path"), ("Torch", "save")):
        assert never_replayed(prefix, api).startswith("not a computation"), api
    assert never_replayed("Tensor", "add") is None and never_replayed("Tensor", "__setitem__") is None


def test_memory_format_arguments_replay(tmp_path):
    """AdamW's zeros_like(p, memory_format=torch.preserve_format): the argument comes back, the call replays."""
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="tensor", level="L1")
    dbg.start()
    torch.zeros_like(torch.ones(2, 3), memory_format=torch.preserve_format)
    torch.ones(1, 2, 3, 3).contiguous(memory_format=torch.channels_last).mul(2)
    dbg.stop()
    dbg.step()
    s = acc_check(str(tmp_path / "dump"), str(tmp_path / "out"), quiet=True)
    verdicts = {c["name"]: (c["verdict"], c["reason"]) for c in s["calls"]}
    assert verdicts["Torch.zeros_like.0.forward"][0] == "pass", verdicts
    assert verdicts["Tensor.contiguous.0.forward"][0] == "pass", verdicts
