"""The user's own errors are the user's: an exception raised by the user's computation (a forward, a backward,
a hook of the user's, an operator that fails when the framework runs it asynchronously and surfaces at a
synchronisation the debugger makes) reaches the user as without the debugger, the same exception object, and
is never logged as the debugger's "internal failure". The debugger's state stays consistent, so the next step
records as a step of a fresh run does. A bug of the debugger's own is still reported once and survived.

Both frameworks: PyTorch on CPU (synchronous: its errors raise inside the user's call, through the debugger's
hooks and API capture), and MindSpore 2.10 on CPU, whose `mint.optim.AdamW` has no CPU kernel: the failure
surfaces at the next synchronisation, which with the debugger on may be one the debugger makes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import assert_stats, data, load

from msprobe_lite.core import safety
from msprobe_lite.pytorch import PrecisionDebugger

LEVELS = ("L0", "L1", "mix")


def _config(tmp_path, name, level, steps):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"task": "statistics", "dump_path": str(tmp_path / name), "level": level,
                                "step": steps}))
    return str(path)


def _internal_failures(err: str) -> int:
    return err.count("internal failure")


# -- PyTorch ---------------------------------------------------------------------------------------------------
class UsersError(Exception):
    """An exception class of the user's: what reaches the user must be this very object."""


class Explode(torch.autograd.Function):
    """A user's custom autograd Function whose backward raises."""

    raised = None

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        Explode.raised = UsersError("the user's backward failed")
        raise Explode.raised


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.fail = None   # an exception to raise after `lin` ran (the user's forward failing midway)
        self.explode = False

    def forward(self, x):
        h = self.lin(x)
        if self.fail is not None:
            raise self.fail
        return Explode.apply(h) if self.explode else torch.tanh(h)


class Net(nn.Module):
    """fc1 -> inner (a module with a child) -> fc2: a failure inside `inner` has modules around it and in it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.inner = Inner()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.inner(F.relu(self.fc1(x))))


def _net():
    torch.manual_seed(0)
    return Net(), torch.randn(4, 8), torch.randint(0, 4, (4,))


def _step(debugger, model, x, y):
    debugger.start(model=model)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    debugger.stop()
    debugger.step()
    return loss


def _reference(tmp_path, level):
    """Step 0 of a fresh run on the same weights: what a step after the user's failure must record."""
    model, x, y = _net()
    debugger = PrecisionDebugger(_config(tmp_path, "reference", level, [0]))
    loss = _step(debugger, model, x, y)
    return loss, model(x)


def _assert_step_records_as_fresh(tmp_path, name, step, level):
    assert data(tmp_path / name, step) == data(tmp_path / "reference", 0)
    assert load(tmp_path / name, step, name="construct.json") == load(tmp_path / "reference", 0,
                                                                       name="construct.json")


def _fail_then_step(tmp_path, level, capsys, fail):
    """Step 0: `fail(model, x, y)` raises the user's exception, which the user catches; step 1 is normal.
    Returns what was caught."""
    model, x, y = _net()
    debugger = PrecisionDebugger(_config(tmp_path, "run", level, [0, 1]))
    debugger.start(model=model)
    with pytest.raises(BaseException) as caught:
        fail(model, x, y)
    model.zero_grad(set_to_none=True)
    debugger.stop()
    debugger.step()
    model.inner.fail, model.inner.explode = None, False
    loss = _step(debugger, model, x, y)
    # the step that failed: the calls that raised left no record, and nothing that names them
    failed = data(tmp_path / "run", 0)
    parents = load(tmp_path / "run", 0, name="construct.json")
    assert set(parents) <= set(failed) and all(p is None or p in failed for p in parents.values()), parents
    ref_loss, ref_out = _reference(tmp_path, level)
    assert torch.equal(loss, ref_loss)
    _assert_step_records_as_fresh(tmp_path, "run", 1, level)
    if level != "L1":
        assert_stats(data(tmp_path / "run", 1)["Module.fc2.Linear.forward.0"]["output"][0], ref_out)
    assert _internal_failures(capsys.readouterr().err) == 0
    return caught.value


@pytest.mark.parametrize("level", LEVELS)
def test_a_user_backward_that_raises_reaches_the_user_and_the_next_step_records_normally(tmp_path, capsys, level):
    def fail(model, x, y):
        model.inner.explode = True
        F.cross_entropy(model(x), y).backward()

    assert _fail_then_step(tmp_path, level, capsys, fail) is Explode.raised


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", (UsersError, KeyboardInterrupt))
def test_a_user_forward_that_raises_reaches_the_user_and_the_next_step_records_normally(tmp_path, capsys, level,
                                                                                       kind):
    # KeyboardInterrupt: PyTorch runs no always-call forward hook for it, so the debugger's module stack must
    # not depend on them
    error = kind("the user's forward failed")

    def fail(model, x, y):
        model.inner.fail = error
        model(x)

    assert _fail_then_step(tmp_path, level, capsys, fail) is error


@pytest.mark.parametrize("level", ("L0", "mix"))
@pytest.mark.parametrize("where", ("pre-hook", "global pre-hook", "hook", "tensor hook"))
def test_a_hook_of_the_users_that_raises_reaches_the_user_and_the_next_step_records_normally(tmp_path, capsys,
                                                                                          level, where):
    error = UsersError(f"the user's {where} failed")

    def raising(*_):
        raise error

    def fail(model, x, y):
        # registered after the debugger's hooks of step 0: a pre-hook of the user's that runs before the
        # debugger's is the global one (PyTorch runs global pre-hooks first)
        if where == "pre-hook":
            handles.append(model.inner.register_forward_pre_hook(raising))
        elif where == "global pre-hook":  # for `inner.lin`: its failure has a module call around it
            handles.append(nn.modules.module.register_module_forward_pre_hook(
                lambda module, args: raising() if module is model.inner.lin else None))
        elif where == "hook":
            handles.append(model.inner.register_forward_hook(raising))
        if where == "tensor hook":
            out = model(x)
            out.register_hook(raising)
            F.cross_entropy(out, y).backward()
        else:
            model(x)

    handles = []
    try:
        caught = _fail_then_step_with_cleanup(tmp_path, level, capsys, fail, handles)
    finally:
        for handle in handles:
            handle.remove()
    assert caught is error


@pytest.mark.parametrize("level", ("L0", "mix"))
def test_a_users_pre_hook_that_raises_inside_a_module_that_catches_it_leaves_that_module_recorded(tmp_path, capsys,
                                                                                               level):
    """PyTorch runs a global pre-hook before the debugger's and, when it raises, still runs the debugger's
    always-call hook: that hook must not end the call around it (`inner`, which catches the failure)."""
    model, x, y = _net()
    error = UsersError("the user's pre-hook failed")

    def raising(module, args):
        if module is model.inner.lin:
            raise error

    def forward(h):  # Inner.forward, catching its child's failure
        try:
            return torch.tanh(model.inner.lin(h))
        except UsersError:
            return h
    model.inner.forward = forward
    debugger = PrecisionDebugger(_config(tmp_path, "run", level, [0]))
    handle = nn.modules.module.register_module_forward_pre_hook(raising)
    try:
        debugger.start(model=model)
        h = F.relu(model.fc1(x))
        out = model(x)
        debugger.stop()
        debugger.step()
    finally:
        handle.remove()
    records = data(tmp_path / "run", 0)
    assert "Module.inner.lin.Linear.forward.0" not in records
    assert_stats(records["Module.inner.Inner.forward.0"]["output"][0], h)
    assert_stats(records["Module.fc2.Linear.forward.0"]["output"][0], out)
    assert _internal_failures(capsys.readouterr().err) == 0


def _fail_then_step_with_cleanup(tmp_path, level, capsys, fail, handles):
    def failing(model, x, y):
        try:
            fail(model, x, y)
        finally:
            for handle in handles:
                handle.remove()
    return _fail_then_step(tmp_path, level, capsys, failing)


@pytest.mark.parametrize("level", LEVELS)
def test_a_failed_accelerator_is_the_users_error_at_the_debuggers_read(tmp_path, capsys, monkeypatch, level):
    """A CUDA kernel of the user's that fails (a device-side assert) leaves the device failing every later call
    with that error, the debugger's reads included, and its synchronize too. No CPU does that: the failed
    device is simulated by its two observable effects. The debugger's read fails inside the user's call (the
    API capture's, C route or Python route, and the module hooks'): the user gets the device's error there."""
    error = RuntimeError("CUDA error: device-side assert triggered")

    def failed_device(*args, **kwargs):
        raise error

    torch.manual_seed(0)
    embed, ids = nn.Embedding(10, 4), torch.tensor([1, 2, 3], dtype=torch.int32)  # int32: read in Python
    model = nn.Sequential(embed)
    debugger = PrecisionDebugger(_config(tmp_path, "run", level, [0]))
    debugger.start(model=model)
    monkeypatch.setattr("msprobe_lite.pytorch.summary._cpu_stats", failed_device)
    monkeypatch.setattr("msprobe_lite.pytorch.summary.TorchSummarizer.synchronize", staticmethod(failed_device))
    with pytest.raises(RuntimeError) as caught:
        model(ids)
    assert caught.value is error
    monkeypatch.undo()
    debugger.stop()
    debugger.step()
    assert _internal_failures(capsys.readouterr().err) == 0


@pytest.mark.parametrize("level", LEVELS)
def test_a_device_failed_by_the_users_last_kernel_fails_stop_with_the_users_error_only(tmp_path, capsys,
                                                                                        monkeypatch, level):
    """The user's last kernel of the step (an optimizer's, say) failed the device: from then on every call
    on it fails, each with a new exception object, as CUDA's do. stop() raises the user's error (its
    synchronisation's), says in one line that the step is not written past its last write, and logs no
    internal failure for the reads that fail after it."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(3, 4)
    debugger = PrecisionDebugger(_config(tmp_path, "run", level, [0]))
    debugger.start(model=model)
    model(x).sum().backward()

    def failed_device(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr("msprobe_lite.pytorch.summary.TorchSummarizer.synchronize", staticmethod(failed_device))
    monkeypatch.setattr(debugger.session, "resolver", failed_device)
    with pytest.raises(RuntimeError, match="device-side assert"):
        debugger.stop()
    err = capsys.readouterr().err
    assert _internal_failures(err) == 0
    assert err.count("step 0 is not written past its last write: the user's computation failed the device") == 1


def test_a_failed_accelerator_at_exit_is_said_as_the_users_not_as_the_debuggers(tmp_path):
    """The user's script dies of a failed device (simulated as above: every read and the synchronize raise);
    at exit the debugger cannot complete the open step: it says so in one plain line, as the user's failure,
    never as an internal failure, and the step written before stays whole."""
    import subprocess
    import sys
    import textwrap

    tests = str(__import__("pathlib").Path(__file__).parent)
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {tests!r})
        import torch
        from models import make
        from msprobe_lite.pytorch import PrecisionDebugger
        from msprobe_lite.pytorch import summary
        model, x, _ = make("mlp")
        debugger = PrecisionDebugger(dump_path={str(tmp_path / "run")!r}, task="statistics", level="L1")
        for step in range(2):
            debugger.start(model=model)
            model(x)
            if step == 1:
                error = RuntimeError("CUDA error: device-side assert triggered")
                def failed_device(*args, **kwargs):
                    raise error
                summary.TorchSummarizer.synchronize = staticmethod(failed_device)
                debugger.session.resolver = failed_device  # the bound method the session calls
                raise error
            debugger.stop()
            debugger.step()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.count("Traceback") == 1  # the user's, ending in the user's error
    assert "\nRuntimeError: CUDA error: device-side assert triggered\n" in done.stderr
    assert "internal failure" not in done.stderr and "Exception ignored" not in done.stderr
    said = [line for line in done.stderr.splitlines() if "is not written" in line]
    assert len(said) == 1 and "step 1 " in said[0] and "the user's computation failed the device" in said[0]
    assert len(said[0]) <= 160
    assert sorted(data(tmp_path / "run")) == ["Functional.linear.0.forward", "Functional.linear.1.forward",
                                              "Functional.relu.0.forward"]  # step 0, written whole


@pytest.mark.parametrize("level", LEVELS)
def test_a_bug_of_the_debugger_is_reported_once_and_training_goes_on_bitwise(tmp_path, capsys, monkeypatch, level):
    from models import train

    want_losses, want_params, want_grads = train("mlp", steps=3)
    debugger = PrecisionDebugger(_config(tmp_path, "run", level, [0, 1, 2]))

    def broken(*args, **kwargs):
        raise ValueError("a bug of the debugger's")

    monkeypatch.setattr(safety, "_seen", {})  # reported once per process: not already seen by another test

    monkeypatch.setattr(debugger.recorder, "end", broken)        # every recorded call's end
    monkeypatch.setattr("msprobe_lite.core.writer.write_step", broken)  # every step's write
    losses, params, grads = train("mlp", steps=3, debugger=debugger)
    assert all(torch.equal(a, b) for a, b in zip(losses, want_losses))
    assert all(torch.equal(params[n], want_params[n]) for n in want_params)
    assert all(torch.equal(g[n], w[n]) for g, w in zip(grads, want_grads) for n in w)
    err = capsys.readouterr().err
    assert "training continues" in err
    assert err.count("internal failure in writing") == 1  # once for the run, not once per step
    assert err.count("internal failure in forward hook") == (0 if level == "L1" else 1)  # L1: no module hooks


# -- MindSpore -------------------------------------------------------------------------------------------------
import mindspore as ms  # noqa: E402
from mindspore import mint, ops  # noqa: E402

import ms_models  # noqa: E402  (PyNative mode)

from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger  # noqa: E402


def _adamw_loop(debugger=None, steps=3):
    """The user's loop with `mint.optim.AdamW`, for which MindSpore 2.10 has no CPU kernel: the optimizer's
    launch fails when MindSpore runs it, which surfaces at the next synchronisation. Returns the exception that
    reached the user and where the loop was then, as (what, iteration)."""
    net, x = ms_models.make("mlp")
    opt = mint.optim.AdamW(net.trainable_params(), lr=0.1)
    grad_fn = ms.value_and_grad(lambda i: (net(i) ** 2).mean(), None, opt.parameters)
    where = None
    try:
        for i in range(steps):
            if debugger is not None:
                where = ("start", i)
                debugger.start(net)
            where = ("forward and backward", i)
            _, grads = grad_fn(x)
            where = ("optimizer", i)
            opt(grads)
            if debugger is not None:
                where = ("stop", i)
                debugger.stop()
                where = ("step", i)
                debugger.step()
            where = ("reading the weights", i)
            net.fc1.weight.asnumpy()
    except Exception as exc:  # noqa: BLE001 - what reaches the user, whatever it is
        return exc, where
    finally:
        if debugger is not None:
            debugger.stop()  # MindSpore's APIs unwrapped for the tests that follow
    return None, where


@pytest.mark.parametrize("level", LEVELS)
def test_mindspore_adamw_without_a_cpu_kernel_fails_the_users_step_with_the_debugger_too(tmp_path, capsys, level):
    plain, plain_where = _adamw_loop()
    assert isinstance(plain, RuntimeError) and "The kernel AdamW unregistered" in str(plain)
    assert plain_where == ("reading the weights", 0)  # the user's first synchronisation after the optimizer

    caught, where = _adamw_loop(MsDebugger(_config(tmp_path, "run", level, [0, 1])))
    # the same error reaches the user in the same step, at a synchronisation the debugger makes (the
    # optimizer's own APIs at L1 and mix, stop() at L0): never logged as the debugger's, never survived
    assert type(caught) is type(plain) and str(caught) == str(plain), caught
    assert where[1] == 0 and where[0] in ("optimizer", "stop"), where
    assert _internal_failures(capsys.readouterr().err) == 0


class MsInner(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = mint.nn.Linear(16, 16)
        self.fail = None

    def construct(self, x):
        h = self.lin(x)
        if self.fail is not None:
            raise self.fail
        return ops.tanh(h)


class MsNet(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = mint.nn.Linear(8, 16)
        self.inner = MsInner()
        self.fc2 = mint.nn.Linear(16, 4)

    def construct(self, x):
        return self.fc2(self.inner(ops.relu(self.fc1(x))))


def _ms_net():
    ms.set_seed(0)
    return MsNet(), ms.Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))


def _ms_step(debugger, net, x):
    grad_fn = ms.value_and_grad(lambda i: (net(i) ** 2).mean(), None, net.trainable_params())
    debugger.start(net)
    loss, _ = grad_fn(x)
    debugger.stop()
    debugger.step()
    return loss.asnumpy()


@pytest.mark.parametrize("level", ("L0", "mix"))
@pytest.mark.parametrize("where", ("construct", "interrupted construct", "pre-hook"))
def test_mindspore_a_cell_or_hook_of_the_users_that_raises_reaches_the_user(tmp_path, capsys, level, where):
    error = (KeyboardInterrupt if where == "interrupted construct" else UsersError)(f"the user's {where} failed")
    net, x = _ms_net()
    debugger = MsDebugger(_config(tmp_path, "run", level, [0, 1]))
    grad_fn = ms.value_and_grad(lambda i: (net(i) ** 2).mean(), None, net.trainable_params())
    handle = None
    if where.endswith("construct"):
        net.inner.fail = error
    else:
        def raising(cell, args):
            raise error
        handle = net.inner.register_forward_pre_hook(raising)
    debugger.start(net)
    with pytest.raises(type(error)) as caught:
        grad_fn(x)
    assert caught.value is error
    debugger.stop()
    debugger.step()
    failed = data(tmp_path / "run", 0)  # the calls that raised left no record, and nothing names them
    parents = load(tmp_path / "run", 0, name="construct.json")
    assert set(parents) <= set(failed) and all(p is None or p in failed for p in parents.values()), parents
    net.inner.fail = None
    if handle is not None:
        handle.remove()
    loss = _ms_step(debugger, net, x)

    ref_net, ref_x = _ms_net()
    ref_loss = _ms_step(MsDebugger(_config(tmp_path, "reference", level, [0])), ref_net, ref_x)
    assert loss.tobytes() == ref_loss.tobytes()
    _assert_step_records_as_fresh(tmp_path, "run", 1, level)
    assert _internal_failures(capsys.readouterr().err) == 0


@pytest.mark.parametrize("level", LEVELS)
def test_mindspore_a_bug_of_the_debugger_after_its_synchronisation_is_reported_once(tmp_path, capsys, monkeypatch,
                                                                                    level):
    """The debugger's statistics fail after it made MindSpore run the user's work: its own failure, reported
    once and survived, with the user's numbers unchanged."""
    want_losses, want_params, want_grads = ms_models.train("mlp", steps=2)

    def broken(*args, **kwargs):
        raise ValueError("a bug of the debugger's")

    monkeypatch.setattr(safety, "_seen", {})
    monkeypatch.setattr("msprobe_lite.mindspore.summary.tensor_stats", broken)
    debugger = MsDebugger(_config(tmp_path, "run", level, [0, 1]))
    losses, params, grads = ms_models.train("mlp", steps=2, debugger=debugger)
    assert [a.tobytes() for a in losses] == [b.tobytes() for b in want_losses]
    assert all(params[n].tobytes() == want_params[n].tobytes() for n in want_params)
    assert all(a.tobytes() == b.tobytes() for ga, gb in zip(grads, want_grads) for a, b in zip(ga, gb))
    err = capsys.readouterr().err
    assert err.count("internal failure in statistics of a tensor") == 1 and "training continues" in err
    assert data(tmp_path / "run", 1)  # the records are kept, without statistics
