"""API-level (L1) and mix dumps: names, counts, values against autograd, in-place ops, filters, identity."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import tanh  # imported by name before the debugger exists: must still be captured

from helpers import (C_ROUTES, ROUTE_PARAMS, ROUTES_HERE, assert_same_files, assert_stats, c_route, data, dump_files,
                     load)
from models import make, train
from test_bitwise import assert_bitwise

from msprobe_lite.pytorch import PrecisionDebugger


def dump_of(tmp_path, fn, level="L1", **cfg):
    """Run `fn()` between start/stop/step with a config built from `cfg`; return (data, dump folder)."""
    body = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level}
    body.update(cfg)
    (tmp_path / "config.json").write_text(json.dumps(body))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    model = fn.__defaults__[0] if fn.__defaults__ else None
    d.start(model=model)
    fn()
    d.stop()
    d.step()
    return data(tmp_path / "dump"), tmp_path / "dump"


def helper(x):
    return torch.sigmoid(x) * 2


def test_names_counts_imports_and_outermost_only(tmp_path):
    x = torch.randn(3, 4)
    w = torch.randn(5, 4)

    def program():
        a = tanh(x)                      # Torch.tanh via a name imported before the debugger
        b = helper(a) + helper(x)        # reused function: counters go on (sigmoid.0, sigmoid.1)
        c = F.linear(b, w)               # its internal ops are not records
        d = F.softmax(c, dim=-1)
        return d @ d.t()

    dump, _ = dump_of(tmp_path, program)
    assert list(dump) == [
        "Torch.tanh.0.forward", "Torch.sigmoid.0.forward", "Tensor.mul.0.forward", "Torch.sigmoid.1.forward",
        "Tensor.mul.1.forward", "Tensor.add.0.forward", "Functional.linear.0.forward",
        "Functional.softmax.0.forward", "Tensor.t.0.forward", "Tensor.matmul.0.forward"]
    assert_stats(dump["Torch.tanh.0.forward"]["output"][0], torch.tanh(x))
    assert dump["Functional.softmax.0.forward"]["input_kwargs"]["dim"] == {"type": "int", "value": -1}
    lin = dump["Functional.linear.0.forward"]
    assert_stats(lin["input_args"][1], w)
    assert_stats(lin["output"][0], F.linear(helper(tanh(x)) + helper(x), w))


def test_inplace_apis_input_before_output_after(tmp_path):
    x = torch.arange(6.0).reshape(2, 3) - 2.5
    before = x.clone()

    def program():
        x.add_(1.0)
        x.relu_()
        x[0] = 7.0

    dump, _ = dump_of(tmp_path, program)
    assert list(dump) == ["Tensor.add_.0.forward", "Tensor.relu_.0.forward", "Tensor.__setitem__.0.forward"]
    assert_stats(dump["Tensor.add_.0.forward"]["input_args"][0], before)
    assert_stats(dump["Tensor.add_.0.forward"]["output"][0], before + 1)
    assert_stats(dump["Tensor.relu_.0.forward"]["input_args"][0], before + 1)
    assert_stats(dump["Tensor.relu_.0.forward"]["output"][0], (before + 1).relu())
    setitem = dump["Tensor.__setitem__.0.forward"]
    assert_stats(setitem["input_args"][0], (before + 1).relu())
    assert setitem["input_args"][1] == {"type": "int", "value": 0}
    assert_stats(setitem["output"][0], x)


def test_inplace_functions_of_torch_and_functional_are_recorded(tmp_path):
    """F.relu_, F.leaky_relu_, torch.sigmoid_, torch.clamp_: in-place functions that PyTorch's list of
    overridable functions leaves out (a new user's trial found them missing from the dump)."""
    x = torch.linspace(-3.0, 3.0, 7)
    before = x.clone()

    def program():
        F.relu_(x)
        F.leaky_relu_(x, 0.1)
        torch.sigmoid_(x)
        torch.clamp_(x, 0.6, 0.9)

    dump, _ = dump_of(tmp_path, program)
    assert list(dump) == ["Functional.relu_.0.forward", "Functional.leaky_relu_.0.forward",
                          "Torch.sigmoid_.0.forward", "Torch.clamp_.0.forward"]
    assert_stats(dump["Functional.relu_.0.forward"]["input_args"][0], before)
    assert_stats(dump["Functional.relu_.0.forward"]["output"][0], before.relu())
    assert_stats(dump["Torch.clamp_.0.forward"]["input_args"][0], before.relu().sigmoid())
    assert_stats(dump["Torch.clamp_.0.forward"]["output"][0], x)


@pytest.mark.parametrize("route", ROUTE_PARAMS)
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_batch_norm_running_statistics_are_seen_after_each_update(tmp_path, monkeypatch, route, task):
    """batch_norm updates its running statistics in place without moving their version: one BatchNorm
    called three times in a step showed every later call the statistics of the first (a new user's trial;
    a filter that left out the first call changed the record). Each call's record holds them as it found
    them, checked against the running mean tracked here."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4)
    xs = [torch.randn(8, 4) + k for k in range(3)]
    means = [torch.zeros(4)]
    for x in xs:  # momentum 0.1: the running mean each call finds
        means.append(0.9 * means[-1] + 0.1 * x.mean(0))
    (tmp_path / "config.json").write_text(json.dumps(
        {"task": task, "dump_path": str(tmp_path / "dump"), "level": "L1"}))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    d.start()
    for x in xs:
        bn(x)
    d.stop()
    d.step()
    dump = data(tmp_path / "dump")
    for n in range(3):
        assert_stats(dump[f"Functional.batch_norm.{n}.forward"]["input_args"][1], means[n])
    if task == "tensor":
        for n in range(3):
            entry = dump[f"Functional.batch_norm.{n}.forward"]["input_args"][1]
            saved = torch.load(tmp_path / "dump" / "step0" / "rank" / "dump_tensor_data" / entry["data_name"])
            assert torch.allclose(saved, means[n], atol=1e-6), (n, saved, means[n])


def test_running_statistics_updated_by_other_apis_are_seen_after_each_update(tmp_path):
    """torch.batch_norm_update_stats (and SyncBatchNorm's gather functions) write the running statistics
    without moving their version too (a review)."""
    rm, rv = torch.zeros(3), torch.ones(3)
    xs = [torch.randn(8, 3) + 5 for _ in range(2)]
    found = []

    def program():
        for x in xs:
            found.append(rm.clone())
            torch.batch_norm_update_stats(x, rm, rv, 0.1)

    dump, _ = dump_of(tmp_path, program)
    for n in range(2):
        assert_stats(dump[f"Torch.batch_norm_update_stats.{n}.forward"]["input_args"][1], found[n])


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_writes_that_keep_the_version_are_not_hidden_by_the_cache(tmp_path, monkeypatch, route):
    """A tensor's summary is cached for the step by (object, version). Writes through `.data`, through a numpy
    array, or a rebinding `t.data = x` leave the version as it was: the next call must still see the new
    values (before, it was given the summary from before the write), views of the written storage too."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    a, b, c, base = torch.randn(6), torch.randn(4, 3), torch.randn(5), torch.randn(8)
    view = base[2:6]
    a0, b0, c0, view0 = a.clone(), b.clone(), c.clone(), view.clone()

    def program():
        torch.tanh(a)
        a.data.mul_(2.0)                 # through .data: a's version stays
        torch.tanh(a)
        torch.relu(b)
        b.numpy()[:] = 3.0               # through numpy
        torch.relu(b)
        torch.exp(c)
        c.data = torch.full((2,), 0.5)   # rebound to other memory
        torch.exp(c)
        torch.sin(view)
        base.data.add_(1.0)              # the base's memory: the view's values too
        torch.sin(view)

    dump, _ = dump_of(tmp_path, program)
    for name, before, after in (("Torch.tanh", a0, a0 * 2), ("Torch.relu", b0, torch.full((4, 3), 3.0)),
                                ("Torch.exp", c0, torch.full((2,), 0.5)), ("Torch.sin", view0, view0 + 1)):
        assert_stats(dump[f"{name}.0.forward"]["input_args"][0], before)
        assert_stats(dump[f"{name}.1.forward"]["input_args"][0], after)
    assert "Tensor.mul_.0.forward" in dump and not any("numpy" in k or "data" in k for k in dump)


def test_an_alias_function_in_the_api_list_is_watched_and_said(tmp_path, caplog):
    """`Tensor.numpy` named in a user's API list: it stays an alias watch (not a record), and the log says so."""
    from types import SimpleNamespace

    from msprobe_lite.pytorch.api_capture import ApiCapture

    path = tmp_path / "apis.yaml"
    path.write_text("tensor: [numpy, add]\n")
    summarizer = SimpleNamespace(taint=lambda args, result=None: None)
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        capture = ApiCapture(None, None, summarizer, None, str(path))
    assert capture.table[torch.Tensor.numpy] is summarizer.taint
    assert capture.table[torch.Tensor.add] == ("Tensor", "add")
    assert "Tensor.numpy is in the API list but is not captured" in caplog.text


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_tensor_files_and_arrays_made_tensors_follow_writes_past_the_version(tmp_path, monkeypatch, route):
    """Task tensor: after a write through `.data` the next call's file is its own, with the new values (it was
    a hard link to the file from before the write). A tensor made over a numpy array by `torch.as_tensor`
    and written through the array is summarised anew."""
    import os

    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    a, array = torch.randn(6), np.arange(4, dtype=np.float32)
    a0 = a.clone()
    kept = []

    def program():
        torch.tanh(a)
        a.data.mul_(2.0)
        torch.tanh(a)
        t = torch.as_tensor(array)
        kept.append(t)
        torch.relu(t)
        array[:] = 7.0
        torch.relu(t)

    dump, folder = dump_of(tmp_path, program, task="tensor")
    files = [os.path.join(folder, "step0", "rank", "dump_tensor_data", f"Torch.tanh.{n}.forward.input.0.pt")
             for n in (0, 1)]
    assert torch.equal(torch.load(files[0]), a0) and torch.equal(torch.load(files[1]), a0 * 2)
    assert_stats(dump["Torch.relu.0.forward"]["input_args"][0], torch.arange(4.0))
    assert_stats(dump["Torch.relu.1.forward"]["input_args"][0], torch.full((4,), 7.0))


def test_an_alias_call_that_changes_the_api_table_does_not_crash(tmp_path):
    """The C handler held the table's entry for an alias function only after the call, which can run Python
    code: a sequence whose items empty the table made `torch.as_tensor` read freed memory (a segfault)."""
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")

    class Emptying:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            if i >= 2:
                raise IndexError(i)
            d.apis.table.clear()
            return float(i)

    d.start()
    out = torch.as_tensor(Emptying())
    d.stop()
    d.step()
    assert torch.equal(out, torch.tensor([0.0, 1.0]))


def test_a_write_between_two_windows_of_one_step_is_seen(tmp_path):
    """Between stop() and the next start() of the same step no alias is seen: stop() empties the cache."""
    t = torch.randn(5)
    t0 = t.clone()
    (tmp_path / "config.json").write_text(json.dumps(
        {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1"}))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    d.start()
    torch.tanh(t)
    d.stop()
    t.data.mul_(3.0)
    d.start()
    torch.tanh(t)
    d.stop()
    d.step()
    dump = data(tmp_path / "dump")
    assert_stats(dump["Torch.tanh.0.forward"]["input_args"][0], t0)
    assert_stats(dump["Torch.tanh.1.forward"]["input_args"][0], t0 * 3)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_weights_clipped_through_data_are_dumped_clipped(tmp_path, level):
    """A training step that clips its weights through `.data` after the update (as WGAN critics and older
    optimizers do) and then evaluates: the evaluation's calls get the clipped weights, and training is
    bitwise the same as without the debugger."""
    def run(debugger):
        model, x, y = make("mlp")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        seen = []
        for _ in range(2):
            if debugger is not None:
                debugger.start(model=model)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            for p in model.parameters():
                p.data.clamp_(-0.05, 0.05)
            seen.append(model.fc1.weight.detach().clone())
            with torch.no_grad():
                out = model(x)
            if debugger is not None:
                debugger.stop()
                debugger.step()
        return out, seen

    (tmp_path / "config.json").write_text(json.dumps(
        {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level}))
    out, seen = run(PrecisionDebugger(str(tmp_path / "config.json")))
    plain_out, _ = run(None)
    assert torch.equal(out, plain_out)
    for step in range(2):
        dump = data(tmp_path / "dump", step)
        linears = [k for k in dump if k.startswith("Functional.linear.") and k.endswith(".forward")]
        assert len(linears) == 4, linears     # fc1 and fc2, in training and in the evaluation
        assert_stats(dump[linears[2]]["input_args"][1], seen[step])


def test_power_operators_and_logsigmoid_are_recorded(tmp_path):
    """`x ** 2` and `x **= 2` reach the mode as `Tensor.__pow__`/`__ipow__`, functions named `pow`/`pow_`
    that are not `Tensor.pow`/`pow_`; the API list left them out (and `F.logsigmoid`, held under another
    name), so a changed exponent went unseen by compare."""
    x = torch.randn(3, 4)
    before = x.clone()
    held = [x]

    def program():
        y = x ** 2
        held[0] **= 3
        z = 2 ** y
        return F.logsigmoid(z)

    dump, _ = dump_of(tmp_path, program)
    assert list(dump) == ["Tensor.__pow__.0.forward", "Tensor.__ipow__.0.forward", "Tensor.__rpow__.0.forward",
                          "Functional.logsigmoid.0.forward"]
    assert_stats(dump["Tensor.__pow__.0.forward"]["output"][0], before ** 2)
    assert dump["Tensor.__pow__.0.forward"]["input_args"][1] == {"type": "int", "value": 2}
    assert_stats(dump["Tensor.__ipow__.0.forward"]["input_args"][0], before)
    assert_stats(dump["Tensor.__ipow__.0.forward"]["output"][0], before ** 3)
    assert_stats(dump["Functional.logsigmoid.0.forward"]["output"][0], F.logsigmoid(2 ** (before ** 2)))


def test_api_raising_inside_try_does_not_disturb_capture(tmp_path):
    a, b = torch.randn(2, 3), torch.randn(4, 5)

    def program():
        try:
            torch.matmul(a, b)           # shapes do not match: raises
        except RuntimeError:
            pass
        torch.matmul(a, a.t())
        torch.relu(a)

    dump, _ = dump_of(tmp_path, program)
    assert list(dump) == ["Tensor.t.0.forward", "Torch.matmul.1.forward", "Torch.relu.0.forward"]


def _micro_batches(tmp_path, lin, xs, level, **cfg) -> dict:
    """The dump of one step in which each of `xs` runs forward and backward through `lin` in turn."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": level, **cfg}))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    d.start(model=lin)
    for x in xs:
        y = lin(x)
        (y * y).sum().backward()
    d.stop()
    d.step()
    return data(tmp_path / "dump")


@pytest.mark.parametrize("route", ROUTE_PARAMS)
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_accumulated_micro_batches_each_get_their_own_gradient(tmp_path, monkeypatch, route, level):
    """Two micro-batches, one optimizer step: each call's backward record holds the gradient of its own
    micro-batch's backward pass (before, the second pass's gradient overwrote the first call's record)."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    xs = [torch.randn(5, 4), torch.randn(5, 4) * 3]
    wanted = []
    for x in xs:                                  # each micro-batch's own dL/dW and dL/db, independently
        w, b = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone().requires_grad_()
        (F.linear(x, w, b) ** 2).sum().backward()
        wanted.append((w.grad, b.grad))
    dump = _micro_batches(tmp_path, lin, xs, level)
    for n, (dw, db) in enumerate(wanted):
        record = dump[f"Functional.linear.{n}.backward"]
        assert_stats(record["output"][1], dw)
        assert_stats(record["output"][2], db)
    assert_stats(dump["Tensor.mul.1.backward"]["input"][0], torch.ones(5, 3))


@pytest.mark.parametrize("route", ROUTE_PARAMS)
@pytest.mark.parametrize("flt", [{"list": ["Functional.linear.0"]},
                                 {"scope": ["Functional.linear.0.forward", "Functional.linear.0.forward"]}])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_filtered_out_call_still_ends_a_weights_earlier_calls(tmp_path, monkeypatch, level, flt, route):
    """Micro-batches with the second one's calls filtered out: the kept first call still holds its own
    micro-batch's weight gradient, as in the unfiltered dump (a filtered-out call that takes the weight ends
    the earlier calls' places, as a recorded one does; before, the second pass's gradient replaced it)."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    lin = nn.Linear(4, 3)
    xs = [torch.randn(5, 4), torch.randn(5, 4) * 3]
    w, b = lin.weight.detach().clone().requires_grad_(), lin.bias.detach().clone().requires_grad_()
    (F.linear(xs[0], w, b) ** 2).sum().backward()  # the first micro-batch's own dL/dW and dL/db
    dump = _micro_batches(tmp_path, lin, xs, level, statistics=flt)
    assert "Functional.linear.1.backward" not in dump
    record = dump["Functional.linear.0.backward"]
    assert_stats(record["output"][1], w.grad)
    assert_stats(record["output"][2], b.grad)


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_setitem_backward_has_the_gradient_of_its_output(tmp_path, monkeypatch, route):
    """`x[i] = y` returns None; its record's output is x after the assignment, and its backward record's
    `input` is now that output's gradient (it was empty), as for any other in-place call."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    a, w, v = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4), torch.randn(4, requires_grad=True)

    def program():
        x = a * 1.0
        x[1] = v
        (x * w).sum().backward()

    dump, _ = dump_of(tmp_path, program)
    backward = dump["Tensor.__setitem__.0.backward"]
    assert_stats(backward["input"][0], w)                       # d(loss)/d(x after the assignment)
    before = w.clone()
    before[1] = 0.0
    assert len(backward["output"]) == 2                          # the tensor arguments: x and v
    assert_stats(backward["output"][0], before)                 # x before: row 1 was overwritten
    assert_stats(backward["output"][1], w[1])                   # v
    assert_stats(dump["Tensor.mul.0.backward"]["output"][0], before)   # what reached x = a * 1.0


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_calls_whose_outputs_get_no_gradient_have_no_backward_record(tmp_path, monkeypatch, route):
    """`x > 0`, `x.detach()`, `x.argmax()`: their inputs get gradients (from other calls), but nothing flows
    into their own backward, so they have none (their records held the input's gradient, as noise)."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    x = torch.randn(3, 4, requires_grad=True)

    def program():
        kept = torch.where(x > 0, x, x * 0.1)
        (kept.sum() + x.detach().sum() + x.argmax()).backward()

    dump, _ = dump_of(tmp_path, program)
    forward = [k for k in dump if k.endswith(".forward")]
    backward = [k for k in dump if k.endswith(".backward")]
    assert forward == ["Tensor.gt.0.forward", "Tensor.mul.0.forward", "Torch.where.0.forward", "Tensor.sum.0.forward",
                       "Tensor.detach.0.forward", "Tensor.sum.1.forward", "Tensor.add.0.forward",
                       "Tensor.argmax.0.forward", "Tensor.add.1.forward"]
    assert sorted(backward) == ["Tensor.add.0.backward", "Tensor.add.1.backward", "Tensor.mul.0.backward",
                                "Tensor.sum.0.backward", "Torch.where.0.backward"]
    mask = (x > 0).float()
    assert_stats(dump["Torch.where.0.backward"]["output"][1], mask + 0.1 * (1 - mask))  # x's whole gradient


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_later_backward_passes_still_fill_the_calls_that_made_a_tensor(tmp_path, monkeypatch, route):
    """An `autograd.grad` pass inside the forward (a gradient penalty), then the training loss's backward: the
    call that made `h` holds the training gradient, and a call only in the second loss holds that loss's
    gradient (the last pass that reaches a tensor wins, as before micro-batches were told apart)."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    torch.manual_seed(0)
    x, w = torch.randn(5, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)

    def program():
        h = torch.tanh(x @ w)
        (dh,) = torch.autograd.grad(h.sum(), x, create_graph=True)
        ((h * 3.0).sum() + (dh ** 2).sum()).backward()
        s = torch.sin(x)
        (torch.cos(s) * 1.0).sum().backward(retain_graph=True)
        (torch.exp(s) * 5.0).sum().backward()

    dump, _ = dump_of(tmp_path, program)
    xx, ww = x.detach().requires_grad_(), w.detach()   # the training loss's gradient at h, independently
    hh = torch.tanh(xx @ ww)
    (dd,) = torch.autograd.grad(hh.sum(), xx, create_graph=True)
    (want_h,) = torch.autograd.grad((hh * 3.0).sum() + (dd ** 2).sum(), hh)
    assert_stats(dump["Torch.tanh.0.backward"]["input"][0], want_h)
    assert_stats(dump["Torch.exp.0.backward"]["output"][0], 5.0 * torch.exp(torch.sin(x.detach())))


def test_backward_values_against_autograd(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(2, 3, requires_grad=True)
    kept = {}

    def program():
        h = F.linear(x, w)
        h.retain_grad()
        kept["h"] = h
        loss = torch.tanh(h).sum()
        loss.backward()

    dump, _ = dump_of(tmp_path, program)
    lin = dump["Functional.linear.0.backward"]
    assert_stats(lin["input"][0], kept["h"].grad)          # grad w.r.t. the output
    assert_stats(lin["output"][0], x.grad)                 # grads w.r.t. the inputs
    assert_stats(lin["output"][1], w.grad)
    assert_stats(dump["Torch.tanh.0.backward"]["output"][0], kept["h"].grad)


def test_composite_api_backward_output_is_the_inputs_gradient(tmp_path):
    torch.manual_seed(0)
    logits = torch.randn(5, 7, requires_grad=True)
    target = torch.randint(0, 7, (5,))

    def program():
        F.cross_entropy(logits, target).backward()

    dump, _ = dump_of(tmp_path, program)
    ce = dump["Functional.cross_entropy.0.backward"]
    assert_stats(ce["output"][0], logits.grad)               # d loss / d logits
    assert ce["output"][1] is None                         # integer targets have no gradient
    assert ce["input"][0]["Max"] == 1.0                    # d loss / d loss


def test_mix_construct_maps_apis_to_modules_and_optimizer(tmp_path):
    model, x, y = make("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def program(m=model):
        F.cross_entropy(m(x), y).backward()
        opt.step()

    dump, folder = dump_of(tmp_path, program, level="mix")
    construct = load(folder, name="construct.json")
    assert construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert construct["Functional.relu.0.forward"] == "Module.act.ReLU.forward.0"
    assert construct["Functional.cross_entropy.0.forward"] is None
    assert construct["Functional.linear.1.backward"] == "Module.fc2.Linear.backward.0"
    # fc1's input needs no gradient: its backward parent is known before any gradient can reach it
    assert construct["Functional.linear.0.backward"] == "Module.fc1.Linear.backward.0"
    assert construct["optimizer"] is None
    opt_records = [n for n, p in construct.items() if p == "optimizer"]
    assert len(opt_records) == 4 and all(n.startswith("Tensor.add_.") for n in opt_records)
    names = list(dump)
    assert names.index("Functional.linear.0.forward") < names.index("Module.fc1.Linear.forward.0")


def test_l1_construct_is_empty_and_stacks_point_at_user_lines(tmp_path):
    x = torch.randn(3)

    def program():
        torch.exp(x)

    _, folder = dump_of(tmp_path, program)
    assert load(folder, name="construct.json") == {}
    stack = load(folder, name="stack.json")
    (names, frames), = stack.values()
    assert names == ["Torch.exp.0.forward"]
    assert "in program, \n torch.exp(x)" in frames[0]


def test_stacks_of_a_generator_resumed_from_two_places_and_of_nested_calls(tmp_path):
    """A generator's frame runs again later from other callers: its calls get the stack of where it was
    resumed each time (a walk that remembered a frame's callers while it runs would get this wrong). Calls
    of one frame from different lines, and of the function it calls, each get their own stack."""
    x = torch.randn(3)

    def values():
        while True:
            yield torch.tanh(x)

    def inner():
        return torch.sin(x)

    def program():
        made = values()
        first = next(made)   # resumed here,
        second = next(made)  # then here,
        third = next(made)   # and here (the walk knows every frame's code by now)
        torch.exp(first)
        inner()
        torch.exp(second)
        inner()

    _, folder = dump_of(tmp_path, program)
    frames = {name: entry[1] for entry in load(folder, name="stack.json").values() for name in entry[0]}
    assert "first = next(made)" in frames["Torch.tanh.0.forward"][1]
    assert "second = next(made)" in frames["Torch.tanh.1.forward"][1]
    assert "third = next(made)" in frames["Torch.tanh.2.forward"][1]
    assert "torch.exp(first)" in frames["Torch.exp.0.forward"][0]
    assert "torch.exp(second)" in frames["Torch.exp.1.forward"][0]
    assert "torch.sin(x)" in frames["Torch.sin.0.forward"][0] and "inner()" in frames["Torch.sin.0.forward"][1]
    assert frames["Torch.sin.0.forward"][1] != frames["Torch.sin.1.forward"][1]  # called from two lines


def test_calls_on_one_line_share_one_stack_and_each_line_has_its_own(tmp_path):
    x = torch.randn(3)

    def program():
        for _ in range(2):
            torch.exp(x) + torch.tanh(x)  # two calls (and an operator) at different offsets of one line
        torch.exp(x)

    _, folder = dump_of(tmp_path, program)
    entries = sorted(load(folder, name="stack.json").values(), key=lambda e: len(e[0]))
    (last_names, last_frames), (line_names, line_frames) = entries
    assert last_names == ["Torch.exp.2.forward"] and "\n torch.exp(x)" in last_frames[0]
    assert line_names == ["Torch.exp.0.forward", "Torch.tanh.0.forward", "Tensor.add.0.forward",
                          "Torch.exp.1.forward", "Torch.tanh.1.forward", "Tensor.add.1.forward"]
    assert "torch.exp(x) + torch.tanh(x)" in line_frames[0]


def test_gradients_reach_calls_whose_inputs_need_none(tmp_path):
    x = torch.randn(4)

    def program():
        w = torch.zeros_like(x, requires_grad=True)  # its input gets no gradient, its output does
        (w * x).sum().backward()
        with torch.no_grad():
            torch.exp(x)                         # nothing can get a gradient: no backward record

    dump, _ = dump_of(tmp_path, program)
    backward = dump["Torch.zeros_like.0.backward"]
    assert_stats(backward["input"][0], x)                # d(sum(w * x))/dw = x
    assert backward["output"] == [None]                  # x, the input, receives none
    assert "Torch.exp.0.forward" in dump and "Torch.exp.0.backward" not in dump


@pytest.mark.parametrize("cfg,expected", [
    ({"statistics": {"list": ["relu"]}}, ["Torch.relu.0.forward", "Torch.relu.0.backward"]),
    ({"statistics": {"scope": ["Torch.exp.0.forward", "Torch.relu.0.forward"]}},
     ["Torch.exp.0.forward", "Tensor.mul.0.forward", "Torch.relu.0.forward", "Torch.relu.0.backward",
      "Tensor.mul.0.backward", "Torch.exp.0.backward"]),
    ({"statistics": {"data_mode": ["backward"]}},
     ["Tensor.sum.0.backward", "Torch.relu.0.backward", "Tensor.mul.0.backward", "Torch.exp.0.backward",
      "Torch.sin.0.backward"]),
])
def test_filters_at_l1(tmp_path, cfg, expected):
    x = torch.randn(4, requires_grad=True)

    def program():
        torch.relu(torch.exp(torch.sin(x)) * 2).sum().backward()

    dump, _ = dump_of(tmp_path, program, **cfg)
    assert list(dump) == expected


@pytest.mark.parametrize("cfg,said", [
    ({"statistics": {"list": ["Functional.linaer.0.forward"]}},
     "no record name matched list ['Functional.linaer.0.forward']"),
    # one entry misspelt, another matching: the typo was not said (a new user's trial)
    ({"statistics": {"list": ["relu", "exq", "sin"]}},
     "list entries ['exq'] matched no record name (the others did; a misspelt name?)"),
    ({"statistics": {"scope": ["Torch.exp.0.forward", "Torch.relu.9.forward"]}},
     "scope's last name 'Torch.relu.9.forward' was not reached: dumped from 'Torch.exp.0.forward' to the end"),
    ({"statistics": {"scope": ["Torch.exq.0.forward", "Torch.relu.0.forward"]}},
     "scope's first name 'Torch.exq.0.forward' was not reached: nothing in the scope was dumped"),
    # in the wrong order (it said the last name was of the other direction)
    ({"statistics": {"scope": ["Torch.relu.0.forward", "Torch.exp.0.forward"]}},
     "scope's last name 'Torch.exp.0.forward' ran before its first name 'Torch.relu.0.forward' (are they in the "
     "wrong order?): dumped from 'Torch.relu.0.forward' to the end of the step"),
    # a backward last name is asked for at its forward call's start, before the range opens: not the order
    ({"statistics": {"scope": ["Torch.relu.0.forward", "Torch.exp.0.backward"]}},
     "scope's last name 'Torch.exp.0.backward' is a record of the other direction"),
])
def test_a_filter_name_that_matches_nothing_is_said_once(tmp_path, caplog, cfg, said):
    """A misspelt `list` or `scope` name gave an empty or a partial dump and no word about it."""
    x = torch.randn(4, requires_grad=True)
    body = {"task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1", **cfg}
    (tmp_path / "config.json").write_text(json.dumps(body))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        for _ in range(2):
            d.start()
            torch.relu(torch.exp(torch.sin(x)) * 2).sum().backward()
            d.stop()
            d.step()
    assert caplog.text.count(said) == 1, caplog.text


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_a_scope_whose_last_call_raised_says_so(tmp_path, caplog, monkeypatch, route):
    """The last name's call raised (in the user's try): the range never closed. It said the last name "is a
    record of the other direction"."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    x = torch.randn(4, 3)

    def program():
        torch.exp(x)
        try:
            torch.matmul(x, x)  # the shapes do not match: raises
        except RuntimeError:
            pass
        torch.relu(x)

    with caplog.at_level("WARNING", logger="msprobe_lite"):
        dump, _ = dump_of(tmp_path, program, statistics={"scope": ["Torch.exp.0.forward", "Torch.matmul.0.forward"]})
    assert list(dump) == ["Torch.exp.0.forward", "Torch.relu.0.forward"]
    assert "scope's last name 'Torch.matmul.0.forward' started but did not end (its call raised?): dumped from " \
           "'Torch.exp.0.forward' to the end of the step" in caplog.text
    assert "other direction" not in caplog.text


def test_module_names_given_to_an_l1_run_are_said_to_be_of_another_level(tmp_path, caplog):
    """A scope copied from an L0 result into an L1 config matched nothing, and the warning's examples
    offered a Module name as a valid form (a new user's trial)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "task": "statistics", "dump_path": str(tmp_path / "dump"), "level": "L1",
        "statistics": {"scope": ["Module.ln.LayerNorm.forward.0", "Module.fc2.Linear.forward.0"]}}))
    d = PrecisionDebugger(str(tmp_path / "config.json"))
    with caplog.at_level("WARNING", logger="msprobe_lite"):
        d.start()
        torch.relu(torch.randn(3))
        d.stop()
        d.step()
    assert not (tmp_path / "dump" / "step0" / "rank" / "dump.json").exists()  # nothing in the scope
    assert "such as Functional.linear.0.forward; an L1 dump has no Module records, L0 and mix have)" in caplog.text


def test_filters_that_match_say_nothing(tmp_path, caplog):
    x = torch.randn(4, requires_grad=True)

    def program():
        torch.relu(torch.exp(torch.sin(x)) * 2).sum().backward()

    with caplog.at_level("WARNING", logger="msprobe_lite"):
        dump_of(tmp_path, program, statistics={"list": ["relu"], "scope": ["Torch.exp.0.forward",
                                                                           "Torch.relu.0.forward"]})
    assert "was not reached" not in caplog.text and "matched" not in caplog.text
    (tmp_path / "b").mkdir()
    with caplog.at_level("WARNING", logger="msprobe_lite"):   # a forward range cannot end at a backward name
        dump, _ = dump_of(tmp_path / "b", program, statistics={"scope": ["Torch.exp.0.forward",
                                                                         "Torch.exp.0.backward"]})
    assert "was not reached" not in caplog.text and "Torch.relu.0.forward" in dump
    assert ("scope's last name 'Torch.exp.0.backward' is a record of the other direction, which does not end a "
            "range of forward records: dumped from 'Torch.exp.0.forward' to the end of the step") in caplog.text


def test_torch_is_untouched(tmp_path):
    before = (torch.add, torch.Tensor.add, F.linear, torch.Tensor.__add__, torch.nn.functional.relu)
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    d.start()
    during = (torch.add, torch.Tensor.add, F.linear, torch.Tensor.__add__, torch.nn.functional.relu)
    x = torch.ones(2)
    assert type(x) is torch.Tensor and isinstance(x + 1, torch.Tensor)
    d.stop()
    d.step()
    assert all(a is b for a, b in zip(before, during))
    assert not torch.overrides._get_current_function_mode_stack()


@c_route
def test_the_c_handler_takes_the_gradient_half_too(tmp_path):
    """The C handler fills Call, BackwardCall, _GradSlot and _HookHandle through their slots (_slots.h), and
    quietly leaves the gradient half to Python when a class's slots no longer match its tables (a slot added
    on one side only, or past SLOTS_MAX): correct, but slower. This says when that happens."""
    from msprobe_lite.pytorch import api_capture
    assert api_capture.FastHandler is not None  # the test set-up builds it (pip install -e .)
    d = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="statistics")
    d.start(model=torch.nn.Linear(2, 2))
    assert d.apis.grads_in_c is True
    d.stop()


@c_route
def test_the_modes_torch_function_is_looked_up_again_at_each_start(tmp_path, monkeypatch):
    """The C handler hands PyTorch a bound __torch_function__ made once per start() (Handler_getattro); a change
    of the class (here a wrapper set on it) is seen from the next start(), and stop() lets go of the method."""
    import gc

    from msprobe_lite.pytorch import api_capture
    assert api_capture.FastHandler is not None  # the test set-up builds it (pip install -e .)
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    d.start()
    kind = type(d.apis)
    torch.sin(torch.ones(2))  # the bound method is made and kept
    assert any(getattr(r, "__self__", None) is d.apis for r in gc.get_referents(d.apis))
    seen = []
    original = kind.__torch_function__

    def spy(self, func, types, args=(), kwargs=None):
        seen.append(func)
        return original(self, func, types, args, kwargs)

    monkeypatch.setattr(kind, "__torch_function__", spy)
    torch.cos(torch.ones(2))  # still the kept method
    d.stop()
    # the kept method refers to the mode: stop() lets go of it
    assert not any(getattr(r, "__self__", None) is d.apis for r in gc.get_referents(d.apis))
    d.step()
    d.start()
    torch.tan(torch.ones(2))  # the class's __torch_function__ now
    monkeypatch.undo()
    d.stop()
    d.step()
    d.start()
    torch.exp(torch.ones(2))
    d.stop()
    d.step()
    assert torch.tan in seen and torch.cos not in seen and torch.exp not in seen
    assert [list(data(tmp_path, step)) for step in range(3)] == [
        ["Torch.sin.0.forward", "Torch.cos.0.forward"], ["Torch.tan.0.forward"], ["Torch.exp.0.forward"]]


def test_nothing_recorded_outside_start_stop(tmp_path):
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    torch.exp(torch.ones(2))
    d.start()
    torch.sin(torch.ones(2))
    d.stop()
    torch.cos(torch.ones(2))
    d.step()
    assert list(data(tmp_path)) == ["Torch.sin.0.forward"]


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("kind", ["mlp_inplace", "cnn", "transformer"])
def test_training_is_bitwise_identical(tmp_path, level, kind):
    baseline = train(kind, steps=3)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    assert_bitwise(baseline, train(kind, steps=3, debugger=debugger))
    assert len(data(tmp_path, step=2)) > 20


@c_route
def test_the_stack_walk_in_c_and_in_python_agree(monkeypatch):
    """core/_fast_stack.c walks the frames for every call; the Python walk is the route where it is not built."""
    import sys

    from msprobe_lite.core import stacks

    walk_c = stacks._walk_c
    assert walk_c is not None  # the test set-up builds it
    collector = stacks.StackCollector(("torch",))

    def nested(depth):
        if depth:
            return nested(depth - 1)
        frame = sys._getframe()
        in_python = collector._walk(frame)  # first sight: decides about every code object on the way
        in_c = walk_c(frame, collector._skip_code)
        cached = [walk_c(frame, collector._skip_code, collector._skip_cache) for _ in range(2)]  # fills, reads
        odd = walk_c(frame, collector._skip_code, bytearray(24))  # not a power of two of slots: no cache
        assert all(w[0] == in_c[0] and w[2:] == in_c[2:] for w in cached + [odd])
        assert any(collector._skip_cache)
        collector.file(f"call{len(walks)}", frame)
        return in_python, in_c

    walks = []
    for route in ("C", "Python"):  # one call site for both
        if route == "Python":
            monkeypatch.setattr(stacks, "_walk_c", None)
            monkeypatch.setattr(collector, "file_known", stacks._nothing_known)
        walks.append(nested(6))
    (in_python, in_c), _ = walks
    # the innermost frame is at another instruction for each walk; every other frame is where it was
    assert in_c[0] == in_python[0] and in_c[2:] == in_python[2:] and in_c[1] != in_python[1]
    assert len(in_c) >= 2 * 7 and all(isinstance(v, int) for v in in_c)
    assert walk_c(sys._getframe(), {}) is None  # a code not yet decided about: the caller decides
    # the same frames and offsets on both routes: the same walk, so both calls are filed under one stack
    (names, frames), = collector.to_json().values()
    assert names == ["call0", "call1"]
    assert "collector.file(" in frames[0] and sum("in nested" in f for f in frames) == 7


@c_route
@pytest.mark.parametrize("depth", [6, 140])  # 140 user frames: more than the C filer reads on the C stack
def test_calls_from_a_known_place_are_filed_under_its_stack_without_python(depth):
    """core/_fast_stack.c's Filer files a call from a walk it has seen (its memo), in every later step too,
    goes on from the walk's key when the walk is new (its codes known), and leaves a new code to Python, on
    deep stacks too. stack.json lists a step's stacks in the order of their first call in that step."""
    import sys

    from msprobe_lite.core import stacks

    collector = stacks.StackCollector(("torch",))
    assert stacks._Filer is not None and isinstance(collector.file_known, stacks._Filer)  # the set-up builds it
    found = []

    def nested(d, name):
        if d:
            return nested(d - 1, name)
        frame = sys._getframe(1)  # the calling frame stays at one instruction: the walk is the same each time
        known = collector.file_known(name, frame)
        found.append(known if known in (None, True) else (known, collector._walk(frame)))
        if known is not True:
            collector.file_new(name, frame, known)

    def here(name):  # one call site
        nested(depth, name)

    def there(name):  # another: the same codes below it, another walk and stack
        nested(depth, name)

    for step in range(3):
        if step == 2:
            there("s2x")
        for i in range(3):
            here(f"s{step}c{i}")
        if step < 2:
            there(f"s{step}x")
        (names, frames), (other, other_frames) = collector.to_json().values()
        if step == 2:  # `there` came first in this step
            (other, other_frames), (names, frames) = (names, frames), (other, other_frames)
        assert names == [f"s{step}c{i}" for i in range(3)] and other == [f"s{step}x"]
        assert sum("in nested" in f for f in frames) == depth and "in here" in frames[depth]
        assert "in there" in other_frames[depth]
        collector.reset()
    # step 0: `here`'s codes are new (Python's walk), then its walk is known, and so for `there`; step 1:
    # everything known, filed in C; step 2: `there` from another line of this function, a new walk of known
    # codes (its key, as the Python walk makes it), then known
    assert found[:8] == [None, True, True, None] + [True] * 4 and found[9:] == [True] * 3
    key, in_python = found[8]
    assert key == in_python and len(key) >= 2 * depth


def test_a_tensor_passed_on_gets_one_hook_for_both_records_unless_changed_in_place(tmp_path, monkeypatch):
    """y is tanh's output and exp's input: one gradient hook fills both backward records. After an in-place
    change the tensor is another autograd node: hooked again, and each record gets its own gradient."""
    from msprobe_lite.core.calls import CallRecorder

    hooked = []  # the step's hooks, counted when the step ends (the C handler hooks without on_grad's Python)
    real = CallRecorder.end_step
    monkeypatch.setattr(CallRecorder, "end_step", lambda self: (hooked.extend(self.grad_handles), real(self))[1])
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, generator=g, requires_grad=True)

    def program():
        y = torch.tanh(x)
        z = torch.exp(y)
        z.sum().backward()

    dump, _ = dump_of(tmp_path, program)
    assert len(hooked) == 4  # x, y, z, the sum: 7 places
    y = torch.tanh(x.detach())
    assert_stats(dump["Torch.tanh.0.backward"]["input"][0], torch.exp(y))     # d(sum)/dy = exp(y)
    assert_stats(dump["Torch.exp.0.backward"]["output"][0], torch.exp(y))    # the same gradient, same hook
    assert_stats(dump["Torch.tanh.0.backward"]["output"][0], torch.exp(y) * (1 - y * y))

    hooked.clear()

    def in_place():
        y = torch.sin(x)
        y.mul_(3.0)           # y changes: sin's output is not exp's input any more
        torch.exp(y).sum().backward()

    (tmp_path / "again").mkdir()
    dump, _ = dump_of(tmp_path / "again", in_place)
    y0 = torch.sin(x.detach())
    e = torch.exp(3.0 * y0)
    assert_stats(dump["Tensor.mul_.0.backward"]["input"][0], e)              # d/d(3y) = exp(3y)
    assert_stats(dump["Torch.exp.0.backward"]["output"][0], e)
    assert_stats(dump["Tensor.mul_.0.backward"]["output"][0], 3.0 * e)       # d/dy before the change
    assert_stats(dump["Torch.sin.0.backward"]["input"][0], 3.0 * e)
    assert_stats(dump["Torch.sin.0.backward"]["output"][0], 3.0 * e * torch.cos(x.detach()))
    assert len(hooked) == 5  # x; y before mul_ (sin's output, mul_'s input); y after; exp's output; sum's


def test_gradient_hooks_share_the_tensors_hook_dict_with_the_users_hooks(tmp_path):
    """TorchFramework.on_grad fills the tensor's hook dict as register_hook does, without torch's handle: the
    user's hooks registered before and after the debugger's still run, in order, and see the gradient
    unchanged; the step's end removes only the debugger's; the user's handles still remove the user's; a
    leaf (a parameter) and a tensor subclass are hooked too."""
    from msprobe_lite.pytorch.framework import TorchFramework

    class Marked(torch.Tensor):
        pass

    g = torch.Generator().manual_seed(7)
    w = nn.Parameter(torch.randn(3, generator=g))
    seen = []
    early = w.register_hook(lambda grad: seen.append(("early", grad.clone())))

    def program(w=w):
        y = torch.tanh(w)
        late = y.register_hook(lambda grad: seen.append(("late", grad.clone())))
        (y ** 2).sum().backward()
        late.remove()

    dump, _ = dump_of(tmp_path, program)
    y = torch.tanh(w.detach())
    assert [name for name, _ in seen] == ["late", "early"]
    torch.testing.assert_close(seen[0][1], 2 * y)
    torch.testing.assert_close(seen[1][1], 2 * y * (1 - y * y))
    reference = w.detach().clone().requires_grad_(True)
    (torch.tanh(reference) ** 2).sum().backward()
    assert torch.equal(w.grad, reference.grad) and torch.equal(seen[1][1], reference.grad)  # bit for bit
    assert_stats(dump["Torch.tanh.0.backward"]["output"][0], 2 * y * (1 - y * y))
    assert list(w._backward_hooks) == [early.id]  # the debugger's hook is gone, the user's stays
    early.remove()
    assert not w._backward_hooks

    twice, runs = torch.randn(2, requires_grad=True) * 2, []
    handles = [TorchFramework.on_grad(twice, runs.append) for _ in range(2)]  # one function, two hooks
    twice.sum().backward()
    assert len(runs) == 2
    handles[0].remove()
    assert len(twice._backward_hooks) == 1
    with torch.inference_mode():
        inference = torch.ones(2)
    for refused in (torch.ones(2), inference):  # as register_hook refuses them
        with pytest.raises(RuntimeError, match="doesn't require gradient"):
            TorchFramework.on_grad(refused, runs.append)

    calls = []
    sub = torch.randn(2, requires_grad=True).as_subclass(Marked) * 2
    handle = TorchFramework.on_grad(sub, calls.append)  # torch's own register_hook: a RemovableHandle
    assert type(handle).__name__ == "RemovableHandle"
    sub.sum().backward()
    assert len(calls) == 1
    handle.remove()
    assert not sub._backward_hooks


def test_a_failing_gradient_place_is_reported_and_the_others_are_filled(tmp_path, monkeypatch):
    """The C handler's gradient hook (GradHook: _GradSlot and BackwardCall.fill in C) fills each place of its
    tensor; one that fails is reported, once, and the hook goes on with the next place; gradients are
    untouched."""
    from msprobe_lite.core import safety

    monkeypatch.setattr(safety, "_seen", {})
    errors = []
    monkeypatch.setattr(safety.log, "error", lambda msg, *a: errors.append(msg % a))
    x = torch.linspace(-2.0, 2.0, 6).requires_grad_(True)
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    d.start()
    y = torch.tanh(x)
    z = torch.exp(y)                      # y's hook: tanh's backward input and exp's backward output
    (hook,) = [h for h in d.recorder._slots.values() if len(h.places) == 2]
    assert type(hook).__name__ == ("GradHook" if C_ROUTES else "_GradSlot")
    tanh_backward = hook.places[0][0]
    assert tanh_backward.name == "Torch.tanh.0.backward"
    tanh_backward.n_out = "not a number"  # its record cannot be made
    z.sum().backward()
    d.stop()
    d.step()
    reference = torch.linspace(-2.0, 2.0, 6).requires_grad_(True)
    torch.exp(torch.tanh(reference)).sum().backward()
    assert torch.equal(x.grad, reference.grad)
    assert len(errors) == 1 and "backward hook of Torch.tanh.0.backward" in errors[0], errors
    dump = data(tmp_path)
    assert "Torch.tanh.0.backward" not in dump
    assert_stats(dump["Torch.exp.0.backward"]["output"][0], torch.exp(torch.tanh(reference.detach())))


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_a_gradient_hook_ends_the_places_of_one_key(tmp_path, monkeypatch, route):
    """`end(key)` (what a filtered-out call does to the hooks of its inputs) drops that key's places and
    keeps the others, in the C handler's GradHook as in the Python route's _GradSlot."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    x = torch.linspace(-2.0, 2.0, 6).requires_grad_(True)
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    d.start()
    y = torch.tanh(x)
    torch.exp(y)                          # y's hook: tanh's backward input and exp's backward output
    (hook,) = [h for h in d.recorder._slots.values() if len(h.places) == 2]
    assert type(hook).__name__ == ("GradHook" if route == "C" else "_GradSlot")
    hook.end("output")
    assert [(b.name, key, i) for b, key, i in hook.places] == [("Torch.tanh.0.backward", "input", 0)]
    assert not hook.fired
    d.stop()
    d.step()


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_the_users_mode_and_tensor_subclass_see_only_the_users_calls(tmp_path, monkeypatch, route):
    """The debugger reads tensors (shape, dtype, memory, version, gradient hooks) for every captured call. A
    TorchFunctionMode of the user's, below the debugger's, and a tensor subclass with its own
    __torch_function__ see the same calls with the debugger as without it, and the numbers are the same."""
    from torch.overrides import TorchFunctionMode

    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)

    seen = []

    class Watching(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(("mode", getattr(func, "__name__", str(func))))
            return func(*args, **(kwargs or {}))

    class Tagged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(("subclass", getattr(func, "__name__", str(func))))
            return super().__torch_function__(func, types, args, kwargs or {})

    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 5, generator=g)
    weight = torch.randn(3, 5, generator=g).requires_grad_(True)

    def program():
        tagged = base.as_subclass(Tagged)
        y = F.linear(torch.tanh(base), weight) * 2
        z = (tagged + 1).sum()
        base.__eq__({tagged: 1})  # a dict keyed by a tensor: the dump names its key by str()
        y.sum().backward()
        return y.detach().clone(), z.detach().clone()

    runs = []
    for debugged in (False, True):
        seen.clear()
        weight.grad = None
        with Watching():
            if debugged:
                d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
                d.start()
            out = program()
            if debugged:
                d.stop()
                d.step()
        runs.append((list(seen), out, weight.grad.clone()))
    (seen_off, out_off, grad_off), (seen_on, out_on, grad_on) = runs
    assert seen_on == seen_off
    assert all(torch.equal(a, b) for a, b in zip(out_on + (grad_on,), out_off + (grad_off,)))
    dump = data(tmp_path)
    assert "Torch.tanh.0.forward" in dump and "Functional.linear.0.backward" in dump


@c_route
def test_a_gradient_hooks_fields_stay_and_its_places_may_change_while_it_runs(tmp_path, monkeypatch):
    """A GradHook's fields cannot be deleted (the C walk reads them); Python code run while it fills its
    places (here a session attribute that empties every hook's places, then fails) neither crashes it nor
    stops training: the failure is reported."""
    import gc

    from msprobe_lite.core import safety

    monkeypatch.setattr(safety, "_seen", {})
    errors = []
    monkeypatch.setattr(safety.log, "error", lambda msg, *a: errors.append(msg % a))
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    x = torch.linspace(-1.0, 1.0, 4).requires_grad_(True)
    d.start()
    y = torch.exp(x)
    hook = next(iter(x._backward_hooks.values()))
    assert type(hook).__name__ == "GradHook"
    for field in ("places", "tensor", "version"):
        with pytest.raises(AttributeError):
            delattr(hook, field)
    session = d.session

    class Meddling(type(session)):
        @property
        def step_open(self):
            for o in gc.get_objects():
                if type(o).__name__ == "GradHook":
                    o.places.clear()
            raise ValueError("after clearing")

    monkeypatch.setattr(session, "__class__", Meddling)
    y.sum().backward()
    session.__class__ = Meddling.__mro__[1]
    d.stop()
    d.step()
    assert torch.equal(x.grad, torch.exp(torch.linspace(-1.0, 1.0, 4)))
    assert errors and "ValueError: after clearing" in errors[0]


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_without_a_mode_a_tensor_subclass_sees_only_the_users_calls(tmp_path, monkeypatch, route):
    """With no torch-function mode of the user's active, the C handler reads plain tensors without turning
    dispatch off; what a tensor subclass would see (its own statistics, str() of a dict key) is still read
    with dispatch off."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    seen = []

    class Tagged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", str(func)))
            return super().__torch_function__(func, types, args, kwargs or {})

    base = torch.linspace(-1.0, 1.0, 6).requires_grad_(True)
    tagged = torch.ones(6).as_subclass(Tagged)
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    d.start()
    seen.clear()
    base.__eq__({tagged: 1})     # its key named by str(tagged) in the dump
    torch.mul(base, 2.0).sum()   # plain tensors only
    torch.add(base, [tagged][0])  # the subclass as an argument: its own __torch_function__ runs, once
    d.stop()
    d.step()
    assert seen == ["add"], seen
    dump = data(tmp_path)
    assert "Tensor.__eq__.0.forward" in dump and "Torch.add.0.forward" in dump


# -- the C handler (pytorch/_fast_capture.c): calls recorded in C as the Python route records them -----------------
class _Listed(list):
    pass


class _Iterated(list):  # its own iteration: the C route leaves its gradient hooks to the Python methods
    def __iter__(self):
        return iter(list(list.__iter__(self)))


def _program(x, w, grad):
    """Captured calls of every shape the C route records; with `grad`, w gets a gradient (hooks, backward)."""
    with torch.set_grad_enabled(grad):
        a = tanh(x)                               # a name imported before the debugger
        b = helper(a) + helper(x)                 # a reused function
        c = F.linear(b, w)                        # its internal ops are not records
        s = F.softmax(c, dim=-1)                  # keyword arguments
        top = torch.max(s, dim=1)                 # torch.return_types: a tuple of two tensors
        halves = torch.split(c, 2, dim=1)         # a plain tuple of tensors
        torch.cat([a, b], dim=0)                  # tensors in a list in the arguments
        c.reshape(torch.Size([5, 3]))             # a torch.Size (a tuple subclass) in the arguments
        torch.stack(_Listed([a, b]))              # a list subclass
        torch.stack(_Iterated([b, a]))            # one that iterates its own way
        try:
            torch.matmul(x, w)                    # the shapes do not match: raises
        except RuntimeError:
            pass
        x.add_(1.0)                               # in place: input before, output after
        x[0] = 7.0                                # __setitem__: the output is x, changed
        ones = torch.zeros_like(s)                # a factory
        if grad:
            (top.values.sum() + halves[1].sum()).backward()
    return x, top, halves, ones


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_calls_take_the_c_route_and_dump_what_the_python_route_dumps(tmp_path, monkeypatch, level, grad):
    from msprobe_lite.core.calls import CallRecorder
    from msprobe_lite.pytorch import api_capture

    assert api_capture.FastHandler is not None or not C_ROUTES  # the test set-up builds it (pip install -e .)
    ended = []  # calls recorded by the Python route (counted at their end: the stack is taken before)
    python_end = CallRecorder.end_api
    monkeypatch.setattr(CallRecorder, "end_api", lambda self, *a: ended.append(a[1]) or python_end(self, *a))
    hooked_in_python = []  # gradients hooked by the Python methods
    python_before = CallRecorder.gradients_before
    monkeypatch.setattr(CallRecorder, "gradients_before",
                        lambda self, call, *a: hooked_in_python.append(call.name) or python_before(self, call, *a))
    model = nn.Linear(4, 4)
    dumps, results = [], []
    for route in ROUTES_HERE:  # one call site for both: the stacks name the same lines
        if route == "Python":
            monkeypatch.setattr(api_capture, "FastHandler", None)
        d = PrecisionDebugger(dump_path=str(tmp_path / route), task="statistics", level=level)
        x = torch.arange(12.0).reshape(3, 4) - 5.5
        w = torch.linspace(-1.0, 1.0, 20).reshape(5, 4).requires_grad_(grad)
        d.start(model=model)
        if level == "mix" and not grad:
            d.apis.in_optimizer = True  # as the optimizer's step hook sets it: the parent is "optimizer"
        results.append(_program(x, w, grad))
        d.stop()
        d.step()
        assert (len(ended) == 0) == (route == "C"), (route, ended)
        if route == "C":  # only the call whose list iterates its own way
            assert hooked_in_python == (["Torch.stack.1.forward"] if grad else []), hooked_in_python
        dumps.append(dump_files(tmp_path / route))
    assert_same_files(dumps[0], dumps[-1], at_least=3)
    dump = data(tmp_path / ROUTES_HERE[0])
    forward = [n for n in dump if n.endswith(".forward")]
    assert forward == [
        "Torch.tanh.0.forward", "Torch.sigmoid.0.forward", "Tensor.mul.0.forward", "Torch.sigmoid.1.forward",
        "Tensor.mul.1.forward", "Tensor.add.0.forward", "Functional.linear.0.forward",
        "Functional.softmax.0.forward", "Torch.max.0.forward", "Torch.split.0.forward", "Torch.cat.0.forward",
        "Tensor.reshape.0.forward", "Torch.stack.0.forward", "Torch.stack.1.forward", "Tensor.add_.0.forward",
        "Tensor.__setitem__.0.forward", "Torch.zeros_like.0.forward"] + (
        ["Tensor.sum.0.forward", "Tensor.sum.1.forward", "Tensor.add.1.forward"] if grad else [])
    # (the failed matmul took Torch.matmul.0)
    x, top, halves, ones = results[0]
    start = torch.arange(12.0).reshape(3, 4) - 5.5
    assert_stats(dump["Torch.tanh.0.forward"]["output"][0], torch.tanh(start))
    assert dump["Functional.softmax.0.forward"]["input_kwargs"]["dim"] == {"type": "int", "value": -1}
    assert [len(dump["Torch.max.0.forward"]["output"]), len(dump["Torch.split.0.forward"]["output"])] == [2, 3]
    assert_stats(dump["Torch.max.0.forward"]["output"][0], top.values)
    assert_stats(dump["Torch.split.0.forward"]["output"][1], halves[1])
    assert_stats(dump["Tensor.add_.0.forward"]["input_args"][0], start)
    assert_stats(dump["Tensor.add_.0.forward"]["output"][0], start + 1)
    assert_stats(dump["Tensor.__setitem__.0.forward"]["output"][0], x)
    assert_stats(dump["Torch.zeros_like.0.forward"]["output"][0], ones)
    if grad:  # d(sum(softmax.max) + sum(c[:, 2:4]))/dw, computed again here without the debugger
        w = torch.linspace(-1.0, 1.0, 20).reshape(5, 4).requires_grad_(True)
        b = helper(torch.tanh(start)) + helper(start)
        c = F.linear(b, w)
        (torch.max(F.softmax(c, dim=-1), dim=1).values.sum() + c[:, 2:4].sum()).backward()
        assert_stats(dump["Functional.linear.0.backward"]["output"][1], w.grad)
    stack = load(tmp_path / ROUTES_HERE[0], name="stack.json")
    frames = next(f for names, f in stack.values() if "Torch.tanh.0.forward" in names)
    assert "in _program, \n a = tanh(x)" in frames[0]
    construct = load(tmp_path / ROUTES_HERE[0], name="construct.json")
    if level == "L1":
        assert construct == {}
    else:
        assert all(construct[n] == (None if grad else "optimizer") for n in dump)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("level, flt", [
    ("L1", {"list": ["linear", "Tensor.add_.0.forward", "max"]}),
    ("mix", {"scope": ["Torch.sigmoid.1.forward", "Torch.split.0.forward"]}),
    ("L1", {"list": ["Functional.linear.0.backward", "Torch.split"]}),
    ("L1", {"data_mode": ["backward"]}),
    ("mix", {"data_mode": ["forward", "output"]})])
def test_filtered_calls_take_the_c_route_and_dump_what_the_python_route_dumps(tmp_path, monkeypatch, level, flt,
                                                                               grad):
    """With `list`, `scope` or one direction, captured calls are still recorded in C (before, any filter sent
    every call to the Python route, and a dump of a few calls cost more than a dump of all of them); the C
    route asks the filter as the Python route does, so the dumps are the same, byte for byte."""
    from msprobe_lite.core.calls import CallRecorder
    from msprobe_lite.pytorch import api_capture

    ended = []
    python_end = CallRecorder.end_api
    monkeypatch.setattr(CallRecorder, "end_api", lambda self, *a: ended.append(a[1]) or python_end(self, *a))
    dumps = []
    for route in ROUTES_HERE:  # one call site for both: the stacks name the same lines
        if route == "Python":
            monkeypatch.setattr(api_capture, "FastHandler", None)
        (tmp_path / f"{route}.json").write_text(json.dumps(
            {"task": "statistics", "dump_path": str(tmp_path / route), "level": level, "statistics": flt}))
        d = PrecisionDebugger(str(tmp_path / f"{route}.json"))
        x = torch.arange(12.0).reshape(3, 4) - 5.5
        w = torch.linspace(-1.0, 1.0, 20).reshape(5, 4).requires_grad_(grad)
        d.start(model=nn.Sequential(nn.Linear(4, 4)))
        _program(x, w, grad)
        d.stop()
        d.step()
        assert (len(ended) == 0) == (route == "C"), (route, ended)
        dumps.append(dump_files(tmp_path / route))
    backward_only = all(part.endswith("backward") for part in flt.get("scope", flt.get("data_mode", ["forward"])))
    if backward_only and not grad:
        assert dumps == [{}] * len(ROUTES_HERE)  # nothing to dump, no files: on both routes
        return
    assert_same_files(dumps[0], dumps[-1], at_least=3)
    names = list(data(tmp_path / ROUTES_HERE[0]))
    if flt.get("list") == ["Functional.linear.0.backward", "Torch.split"]:
        assert sorted(names) == ["Functional.linear.0.backward", "Torch.split.0.backward", "Torch.split.0.forward"][
            0 if grad else 2:]
    elif "list" in flt:
        assert sorted(names) == sorted(["Functional.linear.0.forward", "Torch.max.0.forward", "Tensor.add_.0.forward"]
                                       + (["Torch.max.0.backward", "Functional.linear.0.backward"] if grad else []))
    elif flt.get("scope", [""])[0].endswith(".forward"):
        forward = [n for n in names if n.endswith(".forward")]  # (the backward of a call in scope follows it)
        assert forward[0] == "Torch.sigmoid.1.forward" and forward[-1] == "Torch.split.0.forward", forward
    elif flt.get("data_mode") == ["forward", "output"]:
        assert names and all(n.endswith(".forward") for n in names)
        assert all(list(record) == ["output"] for record in data(tmp_path / ROUTES_HERE[0]).values())
    else:
        assert all(n.endswith(".backward") for n in names) and (len(names) > 0) == grad, names


@pytest.mark.parametrize("kind, level, extra", [("transformer", "L1", {}), ("cnn", "mix", {}),
                                                ("mlp_inplace", "mix", {"summary_mode": "md5"}),
                                                ("mlp_inplace", "L1", {"task": "structure"}),
                                                ("cnn", "mix", {"list": ["conv2d", "relu_", "add_"]}),
                                                ("transformer", "L1", {"data_mode": ["backward", "output"]})])
def test_whole_dumps_of_training_are_the_same_with_and_without_the_c_handler(tmp_path, monkeypatch, kind, level,
                                                                              extra):
    """The optimizer's calls (SGD with momentum: no gradients) take the C route, filtered runs' too; whole
    dumps, byte for byte."""
    from msprobe_lite.pytorch import api_capture

    def dump(route):
        body = {"task": extra.get("task", "statistics"), "dump_path": str(tmp_path / route), "level": level}
        body["statistics"] = {k: v for k, v in extra.items() if k != "task"}
        (tmp_path / f"{route}.json").write_text(json.dumps(body))
        train(kind, steps=2, debugger=PrecisionDebugger(str(tmp_path / f"{route}.json")))
        return dump_files(tmp_path / route)

    dumps = []
    for route in ROUTES_HERE:  # one call site for both
        if route == "Python":
            monkeypatch.setattr(api_capture, "FastHandler", None)
        dumps.append(dump(route))
    assert_same_files(dumps[0], dumps[-1], at_least=6)
    names = data(tmp_path / ROUTES_HERE[0], step=1)
    assert any(n.startswith("Tensor.add_.") for n in names) == ("data_mode" not in extra)  # the optimizer's update


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_a_failure_of_the_capture_is_reported_once_and_the_users_calls_go_on(tmp_path, monkeypatch, caplog, route):
    from msprobe_lite.core import safety
    from msprobe_lite.pytorch import api_capture

    monkeypatch.setattr(safety, "_seen", {})  # reported once per process: not hidden by an earlier test's report
    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)
    d = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="L1")
    x = torch.arange(4.0)
    d.start()
    with torch.no_grad():
        d.session.counters = None               # the debugger's state broken: every record fails to begin
        got = [torch.exp(x), torch.add(x, 1.0), x.mul_(2.0)]
        d.session.counters = {}
        after = torch.tanh(x)
    d.stop()
    d.step()
    assert torch.equal(got[0], torch.arange(4.0).exp()) and torch.equal(got[1], torch.arange(4.0) + 1)
    assert torch.equal(x, torch.arange(4.0) * 2) and torch.equal(after, torch.tanh(x))
    failures = [r for r in caplog.records if "internal failure in API capture" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage()[:200] for r in failures]
    assert list(data(tmp_path / "dump")) == ["Torch.tanh.0.forward"]


@pytest.mark.parametrize("route", ROUTE_PARAMS)
def test_a_call_that_raises_leaves_nothing_but_its_index(tmp_path, monkeypatch, route):
    """An API or a module that raises inside the user's `try` has no record, so it has no parent in
    construct.json, no stack, and no backward record when gradients later reach its inputs."""
    from msprobe_lite.pytorch import api_capture

    if route == "Python":
        monkeypatch.setattr(api_capture, "FastHandler", None)

    class Picky(nn.Module):
        def forward(self, x):
            if x.shape[-1] != 4:
                raise ValueError("expected 4 features")
            return x * 2

    model = nn.Sequential(Picky())
    w = torch.randn(3, 4, requires_grad=True)
    d = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level="mix")
    d.start(model=model)
    try:
        torch.matmul(w, torch.randn(5, 2))       # raises: w's gradient below is not this call's
    except RuntimeError:
        pass
    try:
        model(w[:, :3])                          # the module raises
    except ValueError:
        pass
    model(w).sum().backward()
    d.stop()
    d.step()
    dump = data(tmp_path / "dump")
    assert "Torch.matmul.0.forward" not in dump and "Torch.matmul.0.backward" not in dump
    assert "Module.0.Picky.forward.0" not in dump and "Module.0.Picky.forward.1" in dump  # its index is used
    assert "Module.0.Picky.backward.0" not in dump and "Module.0.Picky.backward.1" in dump
    construct = load(tmp_path / "dump", name="construct.json")
    stacks = load(tmp_path / "dump", name="stack.json")
    named = [n for names, _ in stacks.values() for n in names]
    for gone in ("Torch.matmul.0.forward", "Module.0.Picky.forward.0"):
        assert gone not in construct and gone not in named, gone
    assert set(construct) <= set(dump) and set(named) <= set(dump)  # only records that exist
    assert all(names for names, _ in stacks.values()) and list(stacks) == [str(i) for i in range(len(stacks))]


@pytest.mark.parametrize("break_what", ["module lookup", "construct"])
def test_a_failure_midway_numbers_later_calls_alike_on_both_routes(tmp_path, monkeypatch, break_what):
    """The C route does what the Python route does, in its order: a failure after the call was counted
    leaves its index used on both (found by review: the C route counted after looking up the parent)."""
    from msprobe_lite.core import module_calls
    from msprobe_lite.pytorch import api_capture

    fast_handler, current = api_capture.FastHandler, module_calls.ModuleHooks.current
    fail = [False]

    def failing_current(self):
        if fail[0]:
            fail[0] = False
            raise ValueError("injected")
        return current(self)

    monkeypatch.setattr(module_calls.ModuleHooks, "current", failing_current)
    names = {}
    for route in ROUTES_HERE:
        monkeypatch.setattr(api_capture, "FastHandler", fast_handler if route == "C" else None)
        d = PrecisionDebugger(dump_path=str(tmp_path / route), task="statistics", level="mix")
        model, x = nn.Linear(2, 2), torch.ones(2)
        d.start(model=model)
        with torch.no_grad():
            if break_what == "module lookup":
                fail[0] = True
                torch.exp(x)
            else:
                construct, d.session.construct = d.session.construct, None
                torch.exp(x)
                d.session.construct = construct
            torch.exp(x)
        names[route] = [n for n in d.session.records if "exp" in n]
        d.stop()
        d.step()
    assert all(found == ["Torch.exp.1.forward"] for found in names.values()) and len(names) == len(ROUTES_HERE)


def test_a_frame_without_a_line_is_filed_with_no_source_line():
    """MindSpore's bytecode JIT runs code whose frames report no line (f_lineno None): the stack is filed with
    that frame's file and function and no source text, and calls filed after it are filed as usual."""
    import sys
    import types

    from msprobe_lite.core import stacks

    collector = stacks.StackCollector(("torch",))

    def compiled_by_a_jit():
        pass

    here = sys._getframe()
    lineless = types.SimpleNamespace(f_code=compiled_by_a_jit.__code__, f_lasti=0, f_lineno=None, f_back=here)
    collector.file_new("Tensor.add.0.forward", lineless)
    collector.file("Tensor.add.1.forward", here)
    (names0, frames0), (names1, frames1) = collector.to_json().values()
    assert names0 == ["Tensor.add.0.forward"] and names1 == ["Tensor.add.1.forward"]
    assert frames0[0] == f"File {__file__}, line None, in compiled_by_a_jit, \n "
    assert "collector.file_new(" in frames0[1] and "collector.file(" in frames1[0] and frames0[2:] == frames1[1:]
