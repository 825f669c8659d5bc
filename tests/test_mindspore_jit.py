"""MindSpore's compiled training: the tutorial's `@mindspore.jit` train step (value_and_grad and the optimizer
inside it) and GRAPH_MODE, with start(net)/stop()/step() around each step. The debugger must not change a
number or fail there, must record what runs outside the compiled code, and must say once what it cannot see."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
from mindspore import mint, nn, ops  # noqa: E402

import ms_models  # noqa: E402
from helpers import data, expected_stats  # noqa: E402

from msprobe_lite.mindspore import PrecisionDebugger  # noqa: E402
from msprobe_lite.mindspore.api_capture import load_api_list  # noqa: E402

COMPILED_SAID = "runs as a graph, where the debugger sees nothing"


class Blocks(nn.Cell):
    """Residual blocks in a `for`/`range` loop over a CellList, then LayerNorm and a head."""

    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(8, 8) for _ in range(2)])
        self.norm = nn.LayerNorm((8,))
        self.head = nn.Dense(8, 4)

    def construct(self, x):
        for i in range(len(self.layers)):
            x = x + ops.relu(self.layers[i](x))
        return self.head(self.norm(x))


def make(kind):
    ms.set_seed(0)
    np.random.seed(0)
    net = ms_models.MLP() if kind == "mlp" else Blocks()
    net.set_train(True)
    x = ms.Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    y = ms.Tensor(np.random.RandomState(2).randn(4, 4).astype(np.float32))
    return net, x, y


def train(kind, debugger=None, steps=2, capture_mode="ast", eager_after=None):
    """The tutorial's loop: value_and_grad and the optimizer inside one jit function. `eager_after(net, x)`
    runs in PyNative after the compiled step, inside start()/stop()."""
    net, x, y = make(kind)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = nn.MSELoss()

    def forward_fn(inp, target):
        return loss_fn(net(inp), target)

    grad_fn = ms.value_and_grad(forward_fn, None, opt.parameters)

    @ms.jit(capture_mode=capture_mode)
    def train_step(inp, target):
        loss, grads = grad_fn(inp, target)
        opt(grads)
        return loss

    losses = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net)
        losses.append(train_step(x, y).asnumpy())
        if eager_after is not None:
            eager_after(net, x)
        if debugger is not None:
            debugger.stop()
            debugger.step()
    return losses, {p.name: p.asnumpy().copy() for p in net.get_parameters()}


def assert_same(run_a, run_b):
    (losses_a, params_a), (losses_b, params_b) = run_a, run_b
    assert [a.tobytes() for a in losses_a] == [b.tobytes() for b in losses_b]
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        assert params_a[name].tobytes() == params_b[name].tobytes(), name


def said(capsys, text) -> int:
    return sum(text in line for line in capsys.readouterr().err.splitlines())


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("kind", ["mlp", "blocks"])
def test_jit_train_step_runs_bitwise_as_without_the_debugger_and_is_said_once(tmp_path, capsys, kind, level):
    """Before: L0 and mix failed compiling the hooks (`The parameters number of the function is 3, but the
    number of provided arguments is 2`), L1 failed compiling a wrapper of `ops.make_range` and wrote an empty
    dump without a word on other nets."""
    without = train(kind, steps=3)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    assert_same(without, train(kind, debugger, steps=3))
    assert said(capsys, COMPILED_SAID) == 1
    assert not list(tmp_path.rglob("dump.json"))  # everything ran compiled: nothing to record


TRACE_SCRIPT = """
import sys
sys.path[:0] = [{tests!r}]
import test_mindspore_jit as t
without = t.train("blocks", capture_mode="trace")
debugger = t.PrecisionDebugger(dump_path={dump!r}, task="statistics", level="mix")
t.assert_same(without, t.train("blocks", debugger, capture_mode="trace"))
print("same numbers")
"""


def test_trace_capture_mode_keeps_the_debugger_out_of_the_traced_graph(tmp_path):
    """`capture_mode="trace"` runs the Python code once to record the graph: the hooks and wrappers stand
    aside then (before, that first step was recorded, and the debugger's own reads ran inside the trace).
    In a script of its own: MindSpore's tracer reads the source line of every frame above it, and
    `python -m pytest` has frames without one."""
    script = tmp_path / "trace.py"
    script.write_text(TRACE_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)),
                                          dump=str(tmp_path / "dump")))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    assert done.returncode == 0 and "same numbers" in done.stdout, done.stderr[-3000:]
    assert sum(COMPILED_SAID in line for line in done.stderr.splitlines()) == 1
    assert not list(tmp_path.rglob("dump.json"))


def test_an_eager_forward_beside_the_jit_step_is_recorded_with_its_values(tmp_path):
    """What runs in PyNative within start()/stop() is recorded as usual, with the parameters the compiled
    step has just updated; nothing of the compiled step is (no backward, no parameter gradient)."""
    seen = {}

    def evaluate(net, x):
        seen["x"] = x.asnumpy()
        seen["params"] = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
        seen["out"] = net(x).asnumpy()

    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix", step=[1])
    without = train("mlp", eager_after=lambda net, x: net(x))
    assert_same(without, train("mlp", debugger, eager_after=evaluate))
    d = data(tmp_path, step=1)
    assert [n for n in d if n.startswith("Cell.")] == [
        "Cell.fc1.Linear.forward.0", "Cell.act.ReLU.forward.0", "Cell.fc2.Linear.forward.0"]
    p, x = seen["params"], seen["x"].astype(np.float64)
    hidden = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
    out = hidden @ p["fc2.weight"].T + p["fc2.bias"]
    for name, array in (("Cell.fc1.Linear.forward.0", x), ("Cell.fc2.Linear.forward.0", hidden)):
        entry = d[name]["input_args"][0]
        for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(array)):
            assert entry[key] == pytest.approx(want, rel=1e-5, abs=1e-6), (name, key)
    entry = d["Cell.fc2.Linear.forward.0"]["output"][0]
    for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(out)):
        assert entry[key] == pytest.approx(want, rel=1e-5, abs=1e-6), key
    assert np.allclose(seen["out"], out, rtol=1e-5, atol=1e-6)
    assert not [n for n in d if ".backward." in n or "parameters_grad" in n]


def test_an_eager_optimizer_after_a_jit_gradient_is_recorded(tmp_path):
    """The gradient computed by a jit function, then an optimizer that runs in PyNative (`mint.optim.SGD`;
    the `nn` optimizers compile their own construct with mindspore.jit): its calls are recorded (L1), with the
    parameters and the gradients the compiled function returned."""
    def run(debugger):
        net, x, y = make("mlp")
        opt = mint.optim.SGD(net.trainable_params(), lr=0.1)
        loss_fn = nn.MSELoss()

        def forward_fn(inp, target):
            return loss_fn(net(inp), target)

        grad_step = ms.jit(ms.value_and_grad(forward_fn, None, opt.parameters))
        for _ in range(2):
            if debugger is not None:
                debugger.start(net)
            loss, grads = grad_step(x, y)
            before = [p.asnumpy().copy() for p in opt.parameters]
            opt(grads)
            if debugger is not None:
                debugger.stop()
                debugger.step()
        return ([loss.asnumpy()], {p.name: p.asnumpy().copy() for p in net.get_parameters()}), before, grads

    without, _, _ = run(None)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1", step=[1])
    with_debugger, before, grads = run(debugger)
    assert_same(without, with_debugger)
    d = data(tmp_path, step=1)
    updates = [n for n in d if n.startswith("Tensor.add_.") and n.endswith(".forward")]
    assert len(updates) == len(grads) + 1 == 5  # each parameter's update, then the step counter's
    for name, param, grad in zip(updates, before, grads):
        for value, want in zip(d[name]["input_args"], (param, grad.asnumpy())):
            for key, expected in zip(("Max", "Min", "Mean", "Norm"), expected_stats(want)):
                assert value[key] == pytest.approx(expected, rel=1e-5, abs=1e-6), (name, key)


def test_ms_jit_0_runs_the_step_in_python_and_it_is_recorded(tmp_path, monkeypatch):
    """The way out the warning names: with MS_JIT=0 mindspore.jit runs the function as plain Python."""
    monkeypatch.setenv("MS_JIT", "0")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0", step=[0])
    train("mlp", debugger, steps=1)
    d = data(tmp_path)
    assert {"Cell.fc1.Linear.forward.0", "Cell.fc1.Linear.backward.0", "Cell.fc1.Linear.parameters_grad.0"} <= set(d)


def test_graph_mode_training_with_start_is_bitwise_and_said_once(tmp_path, capsys):
    def run(debugger):
        ms.set_context(mode=ms.GRAPH_MODE)
        try:
            return train("blocks", debugger, steps=2)
        finally:
            ms.set_context(mode=ms.PYNATIVE_MODE)

    without = run(None)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    assert_same(without, run(debugger))
    assert said(capsys, "MindSpore is in GRAPH_MODE") == 1
    assert not list(tmp_path.rglob("dump.json"))


def test_graph_mode_after_hooks_were_installed_in_pynative(tmp_path, capsys):
    """Hooks installed by a PyNative step stay on the cells; a later GRAPH_MODE step compiles the network
    with them: they stand aside and change nothing."""
    def run(debugger):
        net, x, y = make("blocks")
        opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
        train_net = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), opt)
        losses = []
        for mode in (ms.PYNATIVE_MODE, ms.GRAPH_MODE, ms.GRAPH_MODE):
            ms.set_context(mode=mode)
            try:
                if debugger is not None:
                    debugger.start(net)
                losses.append(train_net(x, y).asnumpy())
                if debugger is not None:
                    debugger.stop()
                    debugger.step()
            finally:
                ms.set_context(mode=ms.PYNATIVE_MODE)
        return losses, {p.name: p.asnumpy().copy() for p in net.get_parameters()}

    without = run(None)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    assert_same(without, run(debugger))
    assert "Cell.head.Dense.forward.0" in data(tmp_path, step=0)
    assert not (tmp_path / "step1").exists()
    assert said(capsys, COMPILED_SAID) == 1  # the compiler noted the hooked cells it compiled


def test_wrappers_show_the_compiler_the_api_itself():
    """The capture's wrappers give MindSpore's parser (which compiles `inspect.unwrap(f)`) a function with
    code for every API, including primitive instances such as `ops.make_range`."""
    import inspect

    from msprobe_lite.mindspore.api_capture import ApiCapture

    capture = ApiCapture(session=None, recorder=None)
    for entry, wrapper in zip(capture.entries, [capture._wrap(e) for e in capture.entries]):
        compiled = inspect.unwrap(wrapper)
        assert compiled is not wrapper and hasattr(compiled, "__code__"), entry[:2]
    assert load_api_list()


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_the_compiled_step_warning_is_one_short_line_opening_alike_at_every_level(tmp_path, capsys, level):
    """The warning was ~588 characters, named the cells "(one: a Linear)", and opened otherwise at L1; the run
    recorded nothing and left an empty dump root folder behind."""
    train("mlp", PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level=level), steps=2)
    lines = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(lines) == 1 and len(lines[0]) <= 160, lines
    assert COMPILED_SAID in lines[0] and lines[0].count("step 0: ") == 1, lines
    assert ("the Linear cells were compiled" if level == "L0" else "no call was recorded") in lines[0], lines
    assert not (tmp_path / "dump").exists()  # made ahead by the debugger, left empty: removed


def test_the_jit_and_graph_mode_warnings_fit_a_line():
    from msprobe_lite.mindspore import debugger

    for text in (debugger.JIT_MESSAGE % "cell 'encoder.layers.0'", debugger.GRAPH_MODE_MESSAGE):
        assert len("[msprobe_lite rank0] WARNING: " + text) <= 160, text
