"""The MindSpore adapter (PyNative): L0/L1/mix dumps checked against numbers computed here, bitwise-identical
training, patches gone when idle, tasks, filters, graph mode, seed_all and framework auto-detection."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import mint, nn, ops  # noqa: E402

import ms_models  # noqa: E402
from helpers import data, expected_stats, load  # noqa: E402

import msprobe_lite  # noqa: E402
from msprobe_lite.mindspore import PrecisionDebugger, seed_all  # noqa: E402
from msprobe_lite.mindspore.api_capture import load_api_list  # noqa: E402


def assert_ms_stats(entry, array, dtype="Float32", rel=1e-5):
    array = np.asarray(array)
    assert entry["type"] == "mindspore.Tensor" and "requires_grad" not in entry
    assert entry["dtype"] == dtype and entry["shape"] == list(array.shape)
    for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(array)):
        assert math.isclose(entry[key], want, rel_tol=rel, abs_tol=1e-6), (key, entry[key], want)


def run_once(tmp_path, level, kind="mlp", task="statistics", **config):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task=task, level=level, **config)
    result = ms_models.train(kind, steps=1, debugger=debugger)
    return debugger, result


# -- L0 -------------------------------------------------------------------------------------------------------
def test_without_tensor_hooks_cells_keep_their_backward_records(tmp_path, monkeypatch):
    """MindSpore 2.0 has no Tensor.register_hook: no tensor "may get" a gradient there, and the rule that drops
    the backward record of a call whose outputs get none must not drop every cell's (simulated here)."""
    import msprobe_lite.mindspore.framework as fw

    monkeypatch.setattr(fw, "TENSOR_HOOKS", False)
    monkeypatch.setattr(fw.MindSporeFramework, "tensor_hooks", False)
    run_once(tmp_path, "L0")
    backward = sorted(k for k in load(tmp_path)["data"] if ".backward." in k)
    assert backward == ["Cell.act.ReLU.backward.0", "Cell.fc1.Linear.backward.0", "Cell.fc2.Linear.backward.0"]


def test_l0_mlp_forward_backward_and_parameter_gradients_match_numpy(tmp_path):
    _, (_, _, grads) = run_once(tmp_path, "L0")
    dump = load(tmp_path)
    assert dump["framework"] == "mindspore" and dump["level"] == "L0"
    d = dump["data"]
    net, x = ms_models.make("mlp")  # same seed: the weights before the update
    w1, b1 = net.fc1.weight.asnumpy(), net.fc1.bias.asnumpy()
    w2, b2 = net.fc2.weight.asnumpy(), net.fc2.bias.asnumpy()
    xa = x.asnumpy()
    h = xa @ w1.T + b1
    r = np.maximum(h, 0)
    out = r @ w2.T + b2
    fwd = d["Cell.fc1.Linear.forward.0"]
    assert_ms_stats(fwd["input_args"][0], xa)
    assert_ms_stats(fwd["parameters"]["weight"], w1)
    assert_ms_stats(fwd["output"][0], h)
    assert_ms_stats(d["Cell.act.ReLU.forward.0"]["output"][0], r)
    assert_ms_stats(d["Cell.fc2.Linear.forward.0"]["output"][0], out)
    # loss = mean(out**2): d loss / d out = 2 out / out.size
    g_out = 2 * out / out.size
    assert_ms_stats(d["Cell.fc2.Linear.backward.0"]["input"][0], g_out)
    g_r = g_out @ w2
    assert_ms_stats(d["Cell.fc2.Linear.backward.0"]["output"][0], g_r)
    assert_ms_stats(d["Cell.act.ReLU.backward.0"]["output"][0], g_r * (h > 0))
    # parameter gradients equal what value_and_grad returned (order: fc1.weight, fc1.bias, fc2.weight, ...)
    assert_ms_stats(d["Cell.fc1.Linear.parameters_grad.0"]["weight"][0], grads[0][0])
    assert_ms_stats(d["Cell.fc2.Linear.parameters_grad.0"]["bias"][0], grads[0][3])
    assert list(d) .index("Cell.fc2.Linear.backward.0") > list(d).index("Cell.fc2.Linear.forward.0")
    stack = load(tmp_path, name="stack.json")
    assert any("Cell.fc1.Linear.forward.0" in names for names, _ in stack.values())
    construct = load(tmp_path, name="construct.json")
    assert construct["Cell.fc1.Linear.forward.0"] is None


def test_l0_cnn_with_batchnorm_and_in_place_op(tmp_path):
    run_once(tmp_path, "L0", kind="cnn")
    d = data(tmp_path)
    names = list(d)
    for name in ("Cell.conv.Conv2d.forward.0", "Cell.bn.BatchNorm2d.forward.0", "Cell.relu.ReLU.forward.0",
                 "Cell.head.Dense.forward.0", "Cell.head.Dense.backward.0", "Cell.bn.BatchNorm2d.backward.0",
                 "Cell.conv.Conv2d.parameters_grad.0", "Cell.bn.BatchNorm2d.parameters_grad.0"):
        assert name in names, name
    assert set(d["Cell.bn.BatchNorm2d.parameters_grad.0"]) == {"gamma", "beta"}
    relu_out = d["Cell.relu.ReLU.forward.0"]["output"][0]
    head_in = d["Cell.head.Dense.forward.0"]["input_args"][0]
    # channel 0 is set to 0.5 in place after ReLU's output was summarised: ReLU shows its own result
    net, x = ms_models.make("cnn")
    net.set_train(True)
    h = net.relu(net.bn(net.conv(x))).asnumpy()
    assert_ms_stats(relu_out, h, rel=1e-4)
    h[:, 0] = 0.5
    assert_ms_stats(head_in, h.reshape(h.shape[0], -1), rel=1e-4)


def test_cpu_batch_norm_outputs_it_leaves_unwritten_are_null_and_identical_runs_compare_clean(tmp_path):
    """MindSpore's CPU BatchNorm leaves outputs 1 and 2 unwritten in training: recorded, they held whatever
    their reused memory held, and compare named `Primitive.BatchNorm.0.forward` between two identical runs
    (a new user's trial). They are null; output 3 and 4 are the batch's mean and (biased) variance."""
    from msprobe_lite.compare import compare

    for run in ("a", "b"):
        ops.exp(ms.Tensor(np.full((4,), 3.0 if run == "a" else 5.0, np.float32)))  # memory for BatchNorm to reuse
        run_once(tmp_path / run, "L1", kind="cnn")
    record = data(tmp_path / "a")["Primitive.BatchNorm.0.forward"]
    assert record["output"][1] is None and record["output"][2] is None
    net, x = ms_models.make("cnn")
    conv = net.conv(x).asnumpy()
    assert_ms_stats(record["output"][3], conv.mean(axis=(0, 2, 3)))
    assert_ms_stats(record["output"][4], conv.var(axis=(0, 2, 3)))
    pair = compare(str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "out"), quiet=True).pairs[0]
    assert pair["first_divergence"] is None and pair["counts"]["error"] == pair["counts"]["warning"] == 0, pair


def test_reused_cell_is_numbered_per_call(tmp_path):
    class Twice(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = mint.nn.Linear(4, 4)

        def construct(self, x):
            return self.fc(self.fc(x))

    net = Twice()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    debugger.start(net)
    net(ms.Tensor(np.ones((2, 4), np.float32)))
    debugger.stop()
    debugger.step()
    assert [n for n in data(tmp_path) if "forward" in n] == ["Cell.fc.Linear.forward.0", "Cell.fc.Linear.forward.1"]


# -- L1 and mix ---------------------------------------------------------------------------------------------------
def test_l1_names_counts_values_and_backward(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    w = ms.Parameter(ms.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) / 10), name="w")
    x = ms.Tensor(np.array([[1.0, -2.0], [3.0, 0.5]], np.float32))

    def f(inp):
        y = mint.matmul(inp, w)          # Mint.matmul
        z = ops.tanh(y) + 1              # Functional.tanh, Tensor.add
        z = mint.nn.functional.relu(z * 2)  # Tensor.mul, MintFunctional.relu
        return z.sum()                   # Tensor.sum

    debugger.start()
    try:  # (outside the grad function: an exception inside one breaks MindSpore's own backward)
        ops.exp("not a tensor")          # raises: it must not disturb later capture, nor be numbered
    except TypeError:
        pass
    loss, (gw,) = ms.value_and_grad(f, None, [w])(x)
    debugger.stop()
    debugger.step()
    d = data(tmp_path)
    forward = [n for n in d if n.endswith("forward")]
    assert forward[:2] == ["Mint.matmul.0.forward", "Functional.tanh.0.forward"] and len(forward) == 6
    assert forward[-4:] == ["Tensor.add.0.forward", "Tensor.mul.0.forward", "MintFunctional.relu.0.forward",
                            "Tensor.sum.0.forward"]
    y = x.asnumpy() @ w.asnumpy()
    assert_ms_stats(d["Mint.matmul.0.forward"]["output"][0], y)
    assert_ms_stats(d["Mint.matmul.0.forward"]["input_args"][1], w.asnumpy())
    assert_ms_stats(d["Functional.tanh.0.forward"]["output"][0], np.tanh(y), rel=1e-4)
    assert d["Tensor.mul.0.forward"]["input_args"][1] == {"type": "int", "value": 2}
    # backward of matmul: grad w.r.t. its output, and w.r.t. w (= what value_and_grad returned)
    g_y = 2 * (1 - np.tanh(y) ** 2) * ((np.tanh(y) + 1) * 2 > 0)
    bwd = d["Mint.matmul.0.backward"]
    assert_ms_stats(bwd["input"][0], g_y, rel=1e-4)
    assert_ms_stats(bwd["output"][1], gw.asnumpy(), rel=1e-5)
    assert_ms_stats(bwd["output"][1], x.asnumpy().T @ g_y, rel=1e-4)
    assert not any(n.startswith("Functional.exp") for n in d)  # the call that raised has no record
    stacks = load(tmp_path, name="stack.json")                   # and no stack
    assert not any(n.startswith("Functional.exp") for names, _ in stacks.values() for n in names)
    assert float(loss.asnumpy()) == pytest.approx(float(np.maximum((np.tanh(y) + 1) * 2, 0).sum()), rel=1e-5)


def test_only_outermost_calls_are_records_and_in_place_inputs_are_taken_before(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    x = ms.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    debugger.start()
    y = ops.softmax(x)      # runs further ops/Tensor methods inside: not records
    x.copy_(x + 10)         # in place (MindSpore 2.10's add_ returns a new tensor)
    x[0] = -1.0             # __setitem__: output is x after the change
    debugger.stop()
    debugger.step()
    d = data(tmp_path)
    assert list(d) == ["Functional.softmax.0.forward", "Tensor.add.0.forward", "Tensor.copy_.0.forward",
                       "Tensor.__setitem__.0.forward"]
    assert_ms_stats(d["Functional.softmax.0.forward"]["output"][0], y.asnumpy())
    assert_ms_stats(d["Tensor.copy_.0.forward"]["input_args"][0], [1.0, 2.0, 3.0])
    assert_ms_stats(d["Tensor.copy_.0.forward"]["output"][0], [11.0, 12.0, 13.0])
    assert_ms_stats(d["Tensor.__setitem__.0.forward"]["output"][0], [-1.0, 12.0, 13.0])


def test_mix_maps_api_records_to_their_cell(tmp_path):
    run_once(tmp_path, "mix", kind="attention")
    d = data(tmp_path)
    construct = load(tmp_path, name="construct.json")
    assert construct["Mint.matmul.0.forward"] is None          # in the root's construct
    assert construct["Primitive.Dense.0.forward"] == "Cell.q.Linear.forward.0"
    assert construct["Primitive.Dense.0.backward"] == "Cell.q.Linear.backward.0"
    assert "Cell.norm.LayerNorm.forward.0" in d and "Functional.softmax.0.backward" in d
    # the shared input x: q, k and v all see the same statistics
    assert d["Cell.q.Linear.forward.0"]["input_args"][0] == d["Cell.v.Linear.forward.0"]["input_args"][0]
    # attention weights, recomputed with numpy from the initial weights and the input
    net, x = ms_models.make("attention")
    xa = x.asnumpy().astype(np.float64)
    q, k = (xa @ c.weight.asnumpy().T + c.bias.asnumpy() for c in (net.q, net.k))
    scores = q @ np.swapaxes(k, -1, -2) * net.scale
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    assert_ms_stats(d["Functional.softmax.0.forward"]["input_args"][0], scores, rel=1e-4)
    assert_ms_stats(d["Functional.softmax.0.forward"]["output"][0], attn, rel=1e-4)


# -- never change the user's numbers; leave MindSpore untouched when idle ------------------------------------------
@pytest.mark.parametrize("kind,level", [("mlp", "L0"), ("cnn", "mix"), ("attention", "L1")])
def test_training_is_bitwise_identical_with_the_debugger(tmp_path, kind, level):
    losses_a, params_a, grads_a = ms_models.train(kind, steps=2)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    losses_b, params_b, grads_b = ms_models.train(kind, steps=2, debugger=debugger)
    for a, b in zip(losses_a, losses_b):
        assert a.tobytes() == b.tobytes()
    for name in params_a:
        assert params_a[name].tobytes() == params_b[name].tobytes(), name
    for ga, gb in zip(grads_a, grads_b):
        for a, b in zip(ga, gb):
            assert a.tobytes() == b.tobytes()
    assert (tmp_path / "step1" / "rank" / "dump.json").exists()


def _attributes():
    entries = load_api_list()
    return {(id(owner), attr): owner.__dict__.get(attr) for owner, attr, *_ in entries}


def test_wrapped_apis_are_restored_at_stop_and_for_good_after_the_last_step(tmp_path):
    before = _attributes()
    tanh, add = ops.tanh, ms.Tensor.__dict__.get("__add__")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1", step=[0])
    debugger.start()
    assert ops.tanh is not tanh and "__add__" in ms.Tensor.__dict__
    debugger.stop()
    assert _attributes() == before and ops.tanh is tanh and ms.Tensor.__dict__.get("__add__") is add
    debugger.step()
    debugger.start()            # past the last step: nothing is wrapped again
    assert ops.tanh is tanh
    debugger.stop()
    assert _attributes() == before


def test_l0_hooks_are_removed_after_the_last_step(tmp_path):
    net, x = ms_models.make("mlp")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0", step=[0])
    counts = lambda: sum(len(c._forward_pre_hook) + len(c._forward_hook) for _, c in net.cells_and_names())
    assert counts() == 0
    debugger.start(net)
    assert counts() > 0
    net(x)
    debugger.stop()
    debugger.step()
    assert counts() == 0


# -- tasks -------------------------------------------------------------------------------------------------------
def test_md5_is_crc32_of_raw_bytes(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    debugger.config.statistics.summary_mode  # noqa: B018 - exists
    x = ms.Tensor(np.array([1.5, -2.0, 3.25], np.float32))
    debugger.summarizer.md5 = True
    debugger.start()
    y = ops.exp(x)
    debugger.stop()
    debugger.step()
    entry = data(tmp_path)["Functional.exp.0.forward"]["output"][0]
    assert entry["md5"] == f"{zlib.crc32(y.asnumpy().tobytes()):08x}"


def test_md5_task_from_config(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1",
                                  "statistics": {"summary_mode": "md5"}}))
    debugger = PrecisionDebugger(str(config))
    x = ms.Tensor(np.array([1, 2, 3], np.int32))
    debugger.start()
    y = x * 3
    debugger.stop()
    debugger.step()
    entry = data(tmp_path / "dump")["Tensor.mul.0.forward"]["output"][0]
    assert entry["md5"] == f"{zlib.crc32(y.asnumpy().tobytes()):08x}" and entry["Max"] == 9


def test_tensor_task_writes_npy_files_with_bf16_as_float32(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="L1")
    x = ms.Tensor(np.array([[0.5, -1.25], [2.0, 4.0]], np.float32)).astype(ms.bfloat16)
    debugger.start()
    y = ops.reshape(x, (4,))
    debugger.stop()
    debugger.step()
    dump = load(tmp_path)
    assert dump["dump_data_dir"].endswith("dump_tensor_data")
    entry = dump["data"]["Functional.reshape.0.forward"]["output"][0]
    assert entry["dtype"] == "BFloat16" and entry["data_name"] == "Functional.reshape.0.forward.output.0.npy"
    saved = np.load(os.path.join(dump["dump_data_dir"], entry["data_name"]), allow_pickle=False)
    assert saved.dtype == np.float32 and np.array_equal(saved, y.astype(ms.float32).asnumpy())


def test_structure_task_and_overflow_check(tmp_path):
    run_once(tmp_path / "s", "L0", task="structure")
    d = data(tmp_path / "s")
    assert "Cell.fc1.Linear.forward.0" in d and d["Cell.fc1.Linear.forward.0"] == {}
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "o"), task="overflow_check", level="L1")
    x = ms.Tensor(np.array([1.0, 1e30], np.float32))
    debugger.start()
    y = x * 2          # finite
    z = y * y          # overflows to inf
    ops.relu(z)        # inf in, inf out: past overflow_nums (1 by default)
    debugger.stop()
    debugger.step()
    assert list(data(tmp_path / "o")) == ["Tensor.mul.1.forward"]


def test_save_records_value_and_gradient(tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="debug")
    w = ms.Parameter(ms.Tensor(np.array([1.0, 2.0], np.float32)), name="w")

    def f():
        h = w * 3
        debugger.save(h, "h")
        return (h * h).sum()

    debugger.start()
    ms.value_and_grad(f, None, [w])()
    debugger.stop()
    debugger.step()
    d = load(tmp_path, name="debug.json")["data"]
    assert_ms_stats(d["h.0.debug"], [3.0, 6.0])
    assert_ms_stats(d["h_grad.0.debug"], [6.0, 12.0])


# -- filters -----------------------------------------------------------------------------------------------------
def test_step_scope_list_and_data_mode(tmp_path):
    config = tmp_path / "config.json"

    def dump(**fields):
        body = {"task": "statistics", "dump_path": str(tmp_path / str(len(list(tmp_path.iterdir())))),
                "level": "L1"}
        body.update(fields)
        config.write_text(json.dumps(body))
        debugger = PrecisionDebugger(str(config))
        ms_models.train("mlp", steps=2, debugger=debugger)
        return debugger.config.dump_path

    only_step1 = dump(step=[1])
    assert not os.path.exists(os.path.join(only_step1, "step0")) and os.path.exists(os.path.join(only_step1, "step1"))
    listed = dump(statistics={"list": ["Primitive.Dense.1"]})
    assert set(data(listed)) == {"Primitive.Dense.1.forward", "Primitive.Dense.1.backward"}
    forward_out = dump(statistics={"data_mode": ["forward", "output"]})
    d = data(forward_out)
    assert all(n.endswith("forward") for n in d) and all(set(v) == {"output"} for v in d.values())
    scoped = dump(statistics={"scope": ["Primitive.Dense.0.forward", "Primitive.Dense.1.forward"]})
    assert [n for n in data(scoped) if n.endswith("forward")][0] == "Primitive.Dense.0.forward"
    assert [n for n in data(scoped) if n.endswith("forward")][-1] == "Primitive.Dense.1.forward"


# -- graph mode, seed_all, auto-detection ------------------------------------------------------------------------
def test_graph_mode_warns_and_training_goes_on(tmp_path, capsys):
    net, x = ms_models.make("mlp")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
        debugger.start(net)
        out = net(x)
        debugger.stop()
        debugger.step()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert out.shape == (4, 4)
    assert "GRAPH_MODE" in capsys.readouterr().err


def test_jit_cell_warns(tmp_path, capsys):
    class Jitted(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = mint.nn.Linear(2, 2)

        @ms.jit
        def construct(self, x):
            return self.fc(x)

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Jitted()

        def construct(self, x):
            return self.inner(x) * 2

    net = Outer()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    debugger.start(net)
    out = net(ms.Tensor(np.ones((1, 2), np.float32)))
    debugger.stop()
    debugger.step()
    assert "mindspore.jit" in capsys.readouterr().err and out.shape == (1, 2)
    assert list(data(tmp_path)) == ["Cell.inner.Jitted.forward.0"]


def test_seed_all_repeats_random_numbers_and_removes_dropout():
    script = (
        "import mindspore as ms, numpy as np, random\n"
        "from mindspore import nn, ops\n"
        "from msprobe_lite.mindspore import seed_all\n"
        "def draw():\n"
        "    return (random.random(), float(np.random.rand()), float(ops.rand(1).asnumpy()[0]))\n"
        "seed_all(7); a = draw(); seed_all(7); b = draw()\n"
        "assert a == b, (a, b)\n"
        "seed_all(7, mode=True, rm_dropout=True)\n"
        "x = ms.Tensor(np.ones((4, 4), np.float32))\n"
        "d = nn.Dropout(p=0.5); d.set_train(True)\n"
        "assert np.array_equal(d(x).asnumpy(), x.asnumpy())\n"
        "assert np.array_equal(ops.dropout(x, p=0.5).asnumpy(), x.asnumpy())\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
    with pytest.raises(ValueError, match="seed must be an int"):
        seed_all(-1)


def test_top_level_debugger_picks_mindspore_from_the_model(tmp_path):
    net, x = ms_models.make("mlp")
    debugger = msprobe_lite.PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    assert load(tmp_path)["framework"] == "mindspore"
    explicit = msprobe_lite.PrecisionDebugger(dump_path=str(tmp_path), level="L0", framework="mindspore")
    assert isinstance(explicit, PrecisionDebugger)


def test_a_filter_warning_gives_example_names_of_mindspore(tmp_path, caplog):
    """A list entry that matches nothing: the warning's example names are MindSpore's (they were PyTorch's,
    the wrong vocabulary for someone porting a PyTorch config)."""
    net, x = ms_models.make("mlp")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                                  "statistics": {"list": ["Module.fc1.Linear.forward.0"]}}))
    debugger = msprobe_lite.PrecisionDebugger(str(config))
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        debugger.start(net)
        net(x)
        debugger.stop()
        debugger.step()
    said = [r.getMessage() for r in caplog.records if "matched" in r.getMessage()]
    assert said and "Cell.fc1.Dense.forward.0" in said[0] and "Module.fc1.Linear" in said[0], said


def test_top_level_debugger_says_which_framework_it_took_without_a_model(tmp_path, caplog):
    """Both frameworks imported (this test process has both) and start() without a model: PyTorch's calls are
    dumped, and the log says so and how to pick MindSpore (a MindSpore user's L1 run dumped nothing, unsaid)."""
    import torch  # noqa: F401  (imported: both frameworks are)

    debugger = msprobe_lite.PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        debugger.start()
    debugger.stop()
    debugger.step()
    assert any("both imported" in r.getMessage() and "framework='mindspore'" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("values,dtype", [
    (np.random.RandomState(0).randn(3, 5), ms.float32), (np.random.RandomState(1).randn(7), ms.float16),
    (np.random.RandomState(2).randn(4, 4), ms.bfloat16), (np.random.RandomState(3).randn(6), ms.float64),
    (np.arange(-3, 9), ms.int32), (np.arange(5), ms.int64), (np.arange(4), ms.uint8),
    (np.array([1.0, np.nan, -2.0]), ms.float32), (np.array([1.0, np.inf]), ms.float32), (np.array(2.5), ms.float32)])
def test_accelerator_statistics_ops_agree_with_the_numpy_route(values, dtype):
    """The accelerator route (MindSpore ops, fetched in one batch) is run here on the CPU: every operator it
    uses must exist for these dtypes and give the numbers of the numpy route."""
    from msprobe_lite.core.records import PendingStats, TensorSummary
    from msprobe_lite.mindspore.summary import device_stats, resolve_pending, tensor_stats

    t = ms.Tensor(values).astype(dtype)
    value, kind = device_stats(t)
    summary = TensorSummary("mindspore.Tensor", str(t.dtype), list(t.shape), None)
    resolve_pending([PendingStats(value, kind, summary)])
    want = tensor_stats(t)
    for got, expected in zip(summary.stats, want):
        if isinstance(expected, float) and math.isnan(expected):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(expected, rel=1e-5), (summary.stats, want)


def test_bool_statistics_on_both_routes():
    from msprobe_lite.mindspore.summary import _as_stats, device_stats, tensor_stats

    t = ms.Tensor(np.array([True, False, True]))
    value, kind = device_stats(t)
    assert tensor_stats(t) == _as_stats(value.asnumpy().tolist(), kind) == (True, False, None, None)
