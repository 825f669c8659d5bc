"""Backward records of the API calls inside torch.compile'd graphs (issue 31).

Eager mode hooks each call's input and output tensors: the gradient that reaches them is the backward
record's `output` (inputs) and `input` (outputs). Inside a compiled graph the same hook is put on the same
tensor by a node of the graph (`hook`), which AOTAutograd runs while it traces the backward: the hook's
statistics of the gradient are computed by the backward program and handed to `gradient_stats`, a custom op
registered as having a side effect (so it is kept, in order). A hook adds no autograd node, so the backward
runs as without the debugger; a backend that does not trace autograd runs the hook as it is.

With inductor the statistics and the op do not stay: reading gradients inside the backward program changes
how inductor fuses and orders its kernels, and gradients then differ in the last bits. There the taps are
taken out of the graph before inductor splits it, and its backward program is replayed beside it
(compiled_replay.py). Not in a record (null): a tensor written in place in the graph, and a tuple's item that
the graph does not take as one value.
The backward of a graph is named after the graph's latest forward run (micro-batches run forward, then
backward, each in turn).
"""
from __future__ import annotations

import operator
from threading import Lock

import torch

from ..core.naming import counterpart
from ..core.records import Record
from ..core.safety import report_failure
from . import compiled_stats

PLANS = []  # every instrumented graph's plan, by its id in the taps' arguments (graphs live for the process)
_lock = Lock()  # the backward of a GPU graph runs on autograd's device thread
_SINK = {"on_gradient": None, "recording": None}  # compiled_capture's receivers, set when it imports this module


def effectful_op(name: str, impl):
    """`impl` (annotated, returning None) as the custom op `msprobe_lite::{name}`, registered as having a side
    effect (kept, in order, by AOTAutograd and inductor); None where this PyTorch has no public way to declare
    one. A failure is reported once and gives None too."""
    custom_op = getattr(torch.library, "custom_op", None)
    effect = getattr(getattr(torch.library, "EffectType", None), "ORDERED", None)
    if custom_op is None or effect is None:
        return None
    try:
        op = custom_op(f"msprobe_lite::{name}", mutates_args=())(impl)
        op.register_fake(lambda *args: None)
        if not callable(getattr(op, "register_effect", None)):
            return None
        op.register_effect(effect)
        return getattr(torch.ops.msprobe_lite, name)
    except Exception as exc:  # noqa: BLE001 - no such records, compiled training unchanged
        report_failure(f"registering msprobe_lite::{name}", exc, site="compiled_backward.effectful_op")
        return None


def _gradient_stats(stats: torch.Tensor, plan: int, tap: int) -> None:
    deliver(stats, ((plan, tap, 0),))


def deliver(rows, taps) -> None:
    """Gradient statistics: `rows`, a float64 vector holding the row of each of `taps` ((plan id, tap id,
    offset in `rows`))."""
    receiver = _SINK["on_gradient"]
    if receiver is not None:
        receiver(rows, taps)


GRADIENT_STATS = effectful_op("gradient_stats", _gradient_stats)


def recording() -> bool:
    """Whether a debugger records a step now (the replay of compiled_replay.py costs a backward)."""
    check = _SINK["recording"]
    return check is not None and check()


class _Hook:
    """A tensor hook that hands the gradient's statistics to GRADIENT_STATS: traced into the compiled backward
    when the backend traces autograd (AOTAutograd), run as it is otherwise."""

    __slots__ = ("plan", "tap")

    def __init__(self, plan, tap):
        self.plan, self.tap = plan, tap

    def __call__(self, grad):
        if grad is not None:
            GRADIENT_STATS(compiled_stats.stats_for(grad), self.plan, self.tap)


def hook(x, plan, tap_id) -> None:
    """A node of the graph: hooks `x` when it can get a gradient (no new autograd node: the backward runs its
    nodes in the same order as without the debugger)."""
    if x.requires_grad:
        x.register_hook(_Hook(plan, tap_id))


def add_taps(graph, plan, fake_of, inserted) -> None:
    """Hooks each tensor of `plan.grads` ((node, index) -> places) that may get a gradient and is not written
    in place; fills plan.taps ([places, dtype, shape] per tap id)."""
    if GRADIENT_STATS is None or not plan.grads:
        return
    nodes = list(graph.nodes)
    written = _written_storages(nodes, fake_of)
    last_placeholder = max((n for n in nodes if n.op == "placeholder"), key=nodes.index, default=None)
    plan.id = len(PLANS)
    for (node, index), places in plan.grads.items():
        fake = fake_of(node) if index is None else fake_of(node)[index]
        if not isinstance(fake, torch.Tensor) or not fake.requires_grad or _storage(fake) in written:
            continue
        users = [node] if index is None else [u for u in node.users if u not in inserted
                                              and u.target is operator.getitem and u.args[1] == index]
        if len(users) != 1:  # a tuple's item that the graph does not take, or takes twice
            continue
        source = users[0]
        with graph.inserting_after(last_placeholder if source.op == "placeholder" else source):
            inserted.add(graph.call_function(hook, (source, plan.id, len(plan.taps))))
        shape = tuple(int(d) if isinstance(d, int) else None for d in fake.shape)
        plan.taps.append((places, str(fake.dtype), shape))
    if plan.taps:
        PLANS.append(plan)
    else:
        plan.id = None


def _nodes_in(value):
    if isinstance(value, torch.fx.Node):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _nodes_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _nodes_in(v)


_INPLACE = (operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv)


def _written_storages(nodes, fake_of) -> set:
    """The storages that a call of the graph writes in place (`x.add_()`, `x[i] = y`, `out=`)."""
    written = set()
    for n in nodes:
        if not writes_in_place(n):
            continue
        for t in (n.args[0] if n.args and _in_place_call(n) else None, n.kwargs.get("out")):
            for source in _nodes_in(t):
                fake = fake_of(source)
                if isinstance(fake, torch.Tensor):
                    written.add(_storage(fake))
    return written


def _in_place_call(node) -> bool:
    """`x.add_(y)`, `x[i] = y`, `x += y`: a call that writes its first argument."""
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return node.target in _INPLACE or (name.endswith("_") and not name.startswith("__"))


def writes_in_place(node) -> bool:
    """A call of the graph that writes a tensor it was given (its first argument, or `out=`)."""
    return _in_place_call(node) or (node.op in ("call_function", "call_method") and "out" in node.kwargs)


def _storage(fake):
    try:
        return torch.multiprocessing.reductions.StorageWeakRef(fake.untyped_storage())
    except Exception:  # noqa: BLE001 - a tensor without storage (a subclass): never matches
        return id(fake)


def on_gradient(capture, rows, taps) -> None:
    """Taps' gradient statistics arrived (`rows`, `taps` as for `deliver`): fills the backward records of the
    calls that hold each tensor, named after its graph's latest forward run."""
    session = capture.session
    if not session.step_open:
        return
    dynamic = any(None in PLANS[plan].taps[tap][2] for plan, tap, _ in taps)
    if not compiled_stats.reads_now(rows, dynamic):
        rows = rows.clone()  # left on the device until the step is written: the backward may reuse this memory
    read = compiled_stats.reader(rows, dynamic, session.pending)
    recorder = capture.recorder
    flt = session.filter
    with _lock:
        for plan_id, tap_id, offset in taps:
            plan = PLANS[plan_id]
            run = plan.run
            if run is None:
                continue
            places, dtype, shape = plan.taps[tap_id]
            summary = read(("t", offset, dtype, shape, False))
            for call, key, index in places:
                record = run.backward.get(call)
                if record is None:
                    name = counterpart(run.names[call])
                    if recorder.filtered and not flt.wants(name):
                        continue
                    n_in, n_out = plan.sizes[call]
                    data = {}
                    if recorder.inputs:
                        data["input"] = [None] * n_out
                    if recorder.outputs:
                        data["output"] = [None] * n_in
                    record = run.backward[call] = session.add(Record(name, data))
                    if recorder.parents:
                        parent = run.parents[call]
                        session.set_parent(name, counterpart(parent) if parent is not None else None)
                slots = record.data.get(key)
                if slots is not None and index < len(slots):
                    slots[index] = summary
        session.touch()
