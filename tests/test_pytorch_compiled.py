"""Compiled (torch.compile), scripted (torch.jit.script) and edited models under the debugger.

The debugger must leave a compiled model compiled, with the same graphs and the same numbers as without it, and
name its records as for the uncompiled model; TorchScript modules are said and left alone; modules that the
user adds or replaces between steps are recorded from the next start().
"""
from __future__ import annotations

import functools
import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from helpers import assert_stats, data, deterministic_compiled_runs, load

from lm import Net, batch

from msprobe_lite.pytorch import PrecisionDebugger

STEPS = 3


@pytest.fixture(autouse=True)
def deterministic():
    yield from deterministic_compiled_runs()


def train(how, debugger=None, steps=STEPS, later=None, give="model"):
    """Seeded AdamW training of Net, compiled as `how` says (and `later(net)` after the first step); returns
    (losses, grads per step, params, the model given to start(), the graph counters of dynamo). `give`: what
    start() gets: the model trained ("model"), the uncompiled Net ("net") or nothing ("nothing")."""
    torch._dynamo.reset()
    gc.collect()  # earlier tests' compiled models are gone: the debugger would find them and say them too
    counters.clear()
    torch.manual_seed(0)
    net = Net()
    model = net
    if how == "compiled":
        model = torch.compile(net)
    elif how == "compiled block":
        net.blocks[1] = torch.compile(net.blocks[1])
    elif how == "compile()":
        net.compile()
    elif how == "compile() block":
        net.blocks[1].compile()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    tokens, target = batch()
    losses, grads = [], []
    for step in range(steps):
        if step == 1 and later is not None:
            later(net)
        if debugger is not None and give == "nothing":
            debugger.start()
        elif debugger is not None:
            debugger.start(model=net if give == "net" else model)
        loss = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in net.named_parameters()})
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.detach().clone())
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    graphs = (counters["stats"]["unique_graphs"], counters["stats"]["calls_captured"],
              sum(counters["graph_break"].values()))
    return losses, grads, params, model, graphs


@functools.lru_cache(maxsize=None)
def baseline(how, steps=STEPS):
    losses, grads, params, _, graphs = train(how, steps=steps)
    return losses, grads, params, None, graphs  # (kept, without the model: not a live compiled model)


def assert_bitwise(a, b):
    for x, y in zip(a[0], b[0]):
        assert torch.equal(x, y)
    for ga, gb in zip(a[1], b[1]):
        assert ga.keys() == gb.keys()
        for name in ga:
            assert torch.equal(ga[name], gb[name]), name
    for name in a[2]:
        assert torch.equal(a[2][name], b[2][name]), name


def debugger(tmp_path, level, **kw):
    return PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level, **kw)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_compiled_model_trains_compiled_and_bitwise_as_without_the_debugger(tmp_path, level, caplog):
    base = baseline("compiled")
    assert base[4][0] >= 1 and base[4][1] > 0 and base[4][2] == 0  # dynamo compiled the model, no graph break
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        run = train("compiled", debugger(tmp_path, level))
    assert_bitwise(base, run)
    assert run[4] == base[4]  # the same graphs, as many calls in them, no graph break: nothing ran eagerly
    said = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(said) == 1, said  # once, not once a step
    assert ("not recorded" if level == "L0" else "API calls recorded") in said[0] and len(said[0]) <= 160
    names = list(data(tmp_path, STEPS - 1))
    assert not [n for n in names if "_orig_mod" in n or "OptimizedModule" in n]
    if level != "L1":
        # parameter gradients are accumulated outside compiled code: recorded for every module, named as eager
        step0 = data(tmp_path, 0)
        grads = [n for n in step0 if ".parameters_grad." in n]
        assert len(grads) == len({name.rsplit(".", 1)[0] for name in run[1][0]})
        for name, grad in run[1][0].items():
            path, pname = name.rsplit(".", 1)
            cls = type(run[3]._orig_mod.get_submodule(path)).__name__
            assert_stats(step0[f"Module.{path}.{cls}.parameters_grad.0"][pname][0], grad)
    if level == "L0":  # the root model is not a record and the modules inside it run compiled
        assert all(".parameters_grad." in n for n in names)
        return
    # the eager code around the compiled call is recorded: the loss, then the optimizer's update
    loss = data(tmp_path, 0)["Functional.cross_entropy.0.forward"]
    assert_stats(loss["output"][0], run[0][0])
    # the API calls inside the compiled graphs are recorded, named as in eager mode (compiled_capture.py;
    # tests/test_pytorch_compiled_capture.py checks them)
    assert "Functional.embedding.0.forward" in names and "Functional.linear.8.forward" in names
    assert len(names) > 2  # the optimizer's calls
    if level == "mix":
        construct = load(tmp_path, STEPS - 1, name="construct.json")
        assert "optimizer" in construct.values()


@pytest.mark.parametrize("level, give", [("L0", "net"), ("L1", "net"), ("mix", "net"), ("L1", "nothing")])
def test_the_uncompiled_module_or_no_model_given_trains_compiled_and_bitwise(tmp_path, level, give, caplog):
    """`model = torch.compile(net)`, then start(model=net), or start() at L1: the wrapper is found among the live
    objects at the first start(), and the run is as if it had been given: compiled, bitwise, said once."""
    base = baseline("compiled")
    with caplog.at_level("INFO", logger="msprobe_lite"):
        run = train("compiled", debugger(tmp_path, level), give=give)
    assert_bitwise(base, run)
    assert run[4] == base[4]  # the same graphs and calls in them, no graph break: no hook traced, nothing eager
    messages = [r.getMessage() for r in caplog.records]
    assert all(len(m) <= 160 and "\n" not in m for m in messages), messages
    said = [m for m in messages if "torch.compile" in m]
    assert said == ["the model Net is compiled by torch.compile: " + (
        "its inside is not recorded, only parameter gradients; training is unchanged" if level == "L0" else
        "its graphs' API calls recorded, not its modules; training unchanged")], messages
    assert not [m for m in messages if "internal failure" in m]
    names = list(data(tmp_path, STEPS - 1))
    assert names and not [n for n in names if "_orig_mod" in n or "OptimizedModule" in n]
    if level != "L1":  # the parameter gradients, named as in an eager dump
        grads = {n for n in data(tmp_path, 0) if ".parameters_grad." in n}
        assert "Module.blocks.0.ln.LayerNorm.parameters_grad.0" in grads
        assert len(grads) == len({name.rsplit(".", 1)[0] for name in run[1][0]})
        assert not [n for n in names if ".forward." in n and n.startswith("Module.")]
    if level != "L0":  # the loss around the compiled call, and the calls inside it (compiled_capture.py)
        assert_stats(data(tmp_path, 0)["Functional.cross_entropy.0.forward"]["output"][0], run[0][0])
        assert "Torch.softmax.1.forward" in names


def test_a_wrapper_made_after_the_first_start_is_switched_from_the_next_step(tmp_path, caplog):
    """L1 without a model, compiled after the debugger's first step: that step runs eagerly (said, at its stop()),
    the next ones compiled, the wrapper found again after the fallback."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    dbg = debugger(tmp_path, "L1")
    tokens, target = batch()
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        dbg.start()
        net(tokens).sum().backward()
        dbg.stop()
        dbg.step()
        model = torch.compile(net)
        counters.clear()
        for _ in range(3):
            dbg.start()
            model(tokens).sum().backward()
            dbg.stop()
            dbg.step()
            if _ == 0:
                breaks = sum(counters["graph_break"].values())
    messages = [r.getMessage() for r in caplog.records]
    said = [m for m in messages if "ran eagerly this step" in m]  # (other tests' live wrappers are said at start)
    assert said == ["the model Net ran eagerly this step (the API capture was on): compiled from the next "
                    "step, with its graphs' API calls"], messages
    assert not [m for m in messages if "a function compiled" in m]
    assert breaks and sum(counters["graph_break"].values()) == breaks  # no fallback after the first step
    # compiled from the second step on, with the API calls of its graphs (compiled_capture.py)
    assert "Functional.linear.8.forward" in data(tmp_path, 3)


def test_the_names_of_a_message_are_cut_to_one_line():
    from msprobe_lite.pytorch import compiled

    for listed in (["x" * 300], [f"blocks.{i}" for i in range(100)], ["a" * 60, "b"]):
        for message in (compiled.COMPILED_MESSAGE, compiled.CAPTURED_MESSAGE, compiled.SCRIPTED_MESSAGE,
                        compiled.LATE_MESSAGE):
            assert len(message % compiled.names(listed)) <= 160
    assert compiled.names(["a", "b", "c"]) == "a, b, c"
    assert compiled.names([f"blocks.{i}" for i in range(100)]).endswith("and 96 more")
    assert len(compiled.FALLBACK_MESSAGE % "mix") <= 160


@pytest.mark.parametrize("how", ["compiled block", "compile() block"])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_compiled_submodule_is_one_record_named_as_in_an_eager_dump(tmp_path, level, how, caplog):
    base = baseline(how, steps=1)
    assert base[4][0] >= 1 and base[4][2] == 0
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        run = train(how, debugger(tmp_path / "compiled", level), steps=1)
    assert_bitwise(base, run)
    assert run[4] == base[4]
    assert sum("torch.compile" in r.getMessage() for r in caplog.records) == 1
    eager = train("eager", debugger(tmp_path / "eager", level), steps=1)
    compiled_names = list(data(tmp_path / "compiled"))
    eager_names = list(data(tmp_path / "eager"))
    modules = [n for n in eager_names if n.startswith("Module.")]
    # the compiled block is one call: its own records, none for a wrapper, and of the modules inside it only
    # their parameter gradients (accumulated outside compiled code)
    want = [n for n in modules if not n.startswith("Module.blocks.1.") or n.startswith("Module.blocks.1.Block.")
            or ".parameters_grad." in n]
    # (as a set: compiled code accumulates the gradients in an order of its own, and records are in execution order)
    assert sorted(n for n in compiled_names if n.startswith("Module.")) == sorted(want)
    block = data(tmp_path / "compiled")["Module.blocks.1.Block.forward.0"]
    # its numbers, computed here: block 1's input is block 0's output, from the same parameters
    tokens, _ = batch()
    with torch.no_grad():
        torch.manual_seed(0)
        start = Net()  # the parameters before the optimizer's step: the seeded initial ones
        hidden = start.blocks[0](start.embed(tokens))
        out = start.blocks[1](hidden)
    assert_stats(block["input_args"][0], hidden)
    assert_stats(block["output"][0], out)
    if level == "mix":
        # API calls made before the compiled block pair with the eager dump's, name and parent
        construct = load(tmp_path / "compiled", name="construct.json")
        eager_construct = load(tmp_path / "eager", name="construct.json")
        before = [n for n in eager_names if not n.startswith("Module.")][:3]
        for name in before:
            assert name in compiled_names and construct[name] == eager_construct[name], name


def compile_block_in_place(net):
    net.blocks[1].compile()


def compile_block(net):
    net.blocks[0] = torch.compile(net.blocks[0])


@pytest.mark.parametrize("later", [compile_block_in_place, compile_block])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_module_compiled_after_the_first_step_trains_compiled(tmp_path, level, later):
    """The hooks put on its modules at the first start() come off at the next: they would be compiled."""
    base = train("eager", later=later)
    assert base[4][0] >= 1 and base[4][2] == 0
    run = train("eager", debugger(tmp_path, level), later=later)
    assert_bitwise(base, run)
    assert run[4] == base[4]
    index = 1 if later is compile_block_in_place else 0
    step0, step1 = data(tmp_path, 0), data(tmp_path, 1)
    assert f"Module.blocks.{index}.ln.LayerNorm.forward.0" in step0
    assert f"Module.blocks.{index}.ln.LayerNorm.forward.0" not in step1
    assert f"Module.blocks.{index}.Block.forward.0" in step1
    assert f"Module.blocks.{index}.ln.LayerNorm.parameters_grad.0" in step1


def train_compiled_function(dbg=None, steps=2):
    """Net compiled in place (model.compile()) and a loss function compiled by torch.compile."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    net = Net()
    net.compile()
    loss_fn = torch.compile(lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten()))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    tokens, target = batch()
    losses = []
    for _ in range(steps):
        if dbg is not None:
            dbg.start(model=net)
        loss = loss_fn(net(tokens), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in net.parameters()], dict(counters["stats"])


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_model_compiled_in_place_trains_compiled_and_bitwise_as_without_the_debugger(tmp_path, level, caplog):
    base = baseline("compile()")
    assert base[4][0] >= 1 and base[4][2] == 0
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        run = train("compile()", debugger(tmp_path, level))
    assert_bitwise(base, run)
    assert run[4] == base[4]
    assert sum("torch.compile" in r.getMessage() for r in caplog.records) == 1
    assert "_compiled_call_impl" not in vars(run[3]) or vars(run[3])["_compiled_call_impl"] is not None


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_compiled_function_called_in_the_step_is_safe(tmp_path, level, caplog):
    """At L0 nothing of the debugger's runs in the function: compiled, bitwise. At L1 and mix the API capture is
    on when it is called, which dynamo cannot trace: training goes on and the user is told, once."""
    base = train_compiled_function()
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        got = train_compiled_function(debugger(tmp_path, level))
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "internal failure" in m]
    fallback = [m for m in messages if "a function compiled by torch.compile ran eagerly" in m]
    if level == "L0":
        assert all(torch.equal(a, b) for a, b in zip(base[0], got[0]))
        assert all(torch.equal(a, b) for a, b in zip(base[1], got[1]))
        assert got[2] == base[2] and base[2]["unique_graphs"] >= 2
        assert not fallback
    else:
        assert len(fallback) == 1, messages
        for a, b in zip(base[0], got[0]):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


class Scripted(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.inner = torch.jit.script(nn.Sequential(nn.Linear(16, 16), nn.Tanh()))
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.inner(torch.relu(self.fc1(x))))


def train_scripted(dbg=None):
    torch.manual_seed(0)
    model = Scripted()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)
    losses = []
    # TorchScript's optimizing executor specialises a graph after its first runs, differently in a second
    # scripting of the same code: two runs in one process agree only without it
    with torch.jit.optimized_execution(False):
        for _ in range(2):
            train_step(model, opt, x, dbg, losses)
    return losses, [p.detach().clone() for p in model.parameters()], model, x


def train_step(model, opt, x, dbg, losses):
    if dbg is not None:
        dbg.start(model=model)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if dbg is not None:
        dbg.stop()
        dbg.step()
    losses.append(loss.detach().clone())


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_scripted_module_is_said_once_and_training_is_unchanged(tmp_path, level, caplog):
    base = train_scripted()
    with caplog.at_level("INFO", logger="msprobe_lite"):
        run = train_scripted(debugger(tmp_path, level))
    assert all(torch.equal(a, b) for a, b in zip(base[0], run[0]))
    assert all(torch.equal(a, b) for a, b in zip(base[1], run[1]))
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "internal failure" in m]
    said = [m for m in messages if "TorchScript" in m]
    assert len(said) == 1 and "inner" in said[0] and "\n" not in said[0], said
    names = list(data(tmp_path, 1))
    assert "Module.fc2.Linear.forward.0" in names
    assert not [n for n in names if n.startswith("Module.inner")]
    fc2 = data(tmp_path, 0)["Module.fc2.Linear.forward.0"]
    torch.manual_seed(0)
    fresh, x = Scripted(), run[3]
    with torch.no_grad():
        assert_stats(fc2["input_args"][0], fresh.inner(torch.relu(fresh.fc1(x))))


def test_modules_added_or_replaced_between_steps_are_recorded_from_the_next_start(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    dbg = debugger(tmp_path, "L0")
    dbg.start(model=model)
    model(x).sum().backward()
    dbg.stop()
    dbg.step()
    old = model[2]
    model[2] = nn.Linear(16, 4)                                # replaced
    model.insert(2, nn.Sequential(nn.Linear(16, 16), nn.Tanh()))  # a new block between
    model.zero_grad()
    dbg.start(model=model)
    out = model(x)
    out.sum().backward()
    dbg.stop()
    dbg.step()
    step1 = data(tmp_path, 1)
    forward = [n for n in step1 if ".forward." in n]
    assert forward == ["Module.0.Linear.forward.0", "Module.1.ReLU.forward.0", "Module.2.0.Linear.forward.0",
                       "Module.2.1.Tanh.forward.0", "Module.2.Sequential.forward.0", "Module.3.Linear.forward.0"]
    with torch.no_grad():
        h = model[1](model[0](x))
        new = model[2](h)
    assert_stats(step1["Module.2.0.Linear.forward.0"]["input_args"][0], h)
    assert_stats(step1["Module.2.Sequential.forward.0"]["output"][0], new)
    assert_stats(step1["Module.3.Linear.forward.0"]["input_args"][0], new)
    assert_stats(step1["Module.3.Linear.forward.0"]["output"][0], out)
    assert_stats(step1["Module.3.Linear.parameters_grad.0"]["weight"][0], model[3].weight.grad)
    # the replaced module's hooks are gone: calling it records nothing and holds nothing of the debugger
    assert not old._forward_pre_hooks and not old._forward_hooks
    assert not old.weight._post_accumulate_grad_hooks


def test_the_boundaries_of_a_compiled_module_go_when_the_last_step_raises_the_users_error(tmp_path, monkeypatch):
    """The last selected step's step() raises the user's error (a failed device, simulated by a failing
    synchronisation) once the step is written: the hooks at the compiled module's edge are removed all the same."""
    from msprobe_lite.core import safety

    torch.manual_seed(0)
    net = Net()
    net.blocks[1] = torch.compile(net.blocks[1])
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "run"), task="statistics", level="mix", step=[0])
    debugger.start(model=net)
    net(batch()[0])
    assert debugger.compiled._hooked  # at L1 and mix: the capture's switch at the compiled block's edge
    error = RuntimeError("CUDA error: device-side assert triggered")

    def failed_device():
        with safety.users_work:
            raise error

    monkeypatch.setattr(debugger.summarizer, "settle", failed_device)
    with pytest.raises(RuntimeError) as caught:
        debugger.step()
    assert caught.value is error and debugger.session.finished
    assert not debugger.compiled._hooked


def test_a_run_that_compiles_nothing_does_not_import_dynamo(tmp_path):
    """Importing torch's compiler costs about a second and sets up its machinery in the user's process: a run
    that compiles nothing must not pay it because the debugger looks for compiled modules."""
    import subprocess
    import sys

    script = f"""
import sys, torch
from msprobe_lite.pytorch import PrecisionDebugger
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
for level in ("L0", "L1", "mix"):
    d = PrecisionDebugger(dump_path={str(tmp_path)!r} + "/" + level, task="statistics", level=level)
    d.start(model=model)
    model(torch.randn(2, 4)).sum().backward()
    d.stop()
    d.step()
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
