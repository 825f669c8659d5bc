"""API records from inside torch.compile'd code, their statistics computed by the compiled program (issue 31).

The API capture is a TorchFunctionMode, which dynamo cannot trace: it is off inside compiled code
(compiled.py). Instead, at L1 and mix, each FX graph that dynamo hands to the user's backend (inductor,
aot_eager, a custom one) is given, before that backend compiles it, nodes that compute (Max, Min, Mean, Norm)
of the inputs and outputs of each call that is an API of apis.yaml (the graph's `call_function` and
`call_method` nodes: `F.linear`, `torch.softmax`, `x.chunk`, and `+`, `@`, `/` as the `Tensor.add`,
`Tensor.matmul`, `Tensor.div` that eager mode records for them). They are one extra graph output, a float64
vector, which the wrapper of the compiled function takes off before dynamo sees the outputs, and turns into
records in graph order, numbered from the step's counters as the same calls are in eager mode. The user's
outputs are those of the same compiled program without the debugger: the statistics only read values
(detached, never written), and inductor splits and fuses the graph as if they were not there
(compiled_partition.py); tests check bitwise.

A call of the graph that is no API of the list but a torch operation on tensors is recorded as
`Unmapped.{target}.{n}.forward`: never dropped silently. Backward records come from the compiled backward
(compiled_backward.py), or with inductor from its replay (compiled_replay.py). Not recorded: graphs compiled before the
first start() at L1/mix (dynamo's cache keeps them: said once), and tensor files (statistics only). On a
device, the statistics stay there until the step is written (one transfer a step), except for graphs with
dynamic sizes, whose records need the sizes at once.
Dynamo calls `OutputGraph.call_user_compiler` for every graph (graph breaks and recompilations included):
that method is wrapped while a debugger at L1 or mix lives; graphs compiled then carry their statistics
output for good, and hand it to a debugger only while one collects (ACTIVE).
"""
from __future__ import annotations

import copy
import operator
import re
import sys
import types
from threading import get_ident

import torch

from ..core.naming import BACKWARD, module_record
from ..core.records import Record
from ..core.safety import guarded, log, report_failure
from . import compiled_backward, compiled_partition, compiled_stats

UNMAPPED = "Unmapped"
FORWARD = "forward"
# Python operators in dynamo's graphs, as the Tensor methods that the torch-function mode sees for them
OPERATORS = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
             operator.floordiv: "floor_divide", operator.matmul: "matmul", operator.neg: "neg",
             operator.pow: "pow", operator.mod: "remainder", operator.getitem: "__getitem__",
             operator.setitem: "__setitem__", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
             operator.ge: "ge", operator.eq: "eq", operator.ne: "ne", operator.abs: "abs",
             operator.invert: "bitwise_not", operator.and_: "__and__", operator.or_: "__or__",
             operator.xor: "__xor__", operator.iadd: "__iadd__", operator.isub: "__isub__",
             operator.imul: "__imul__", operator.itruediv: "__itruediv__"}

_state = {"original": None, "owner": None}  # the wrapped OutputGraph.call_user_compiler, and its class
ACTIVE = []  # the API captures of the debuggers collecting now (start() to stop()): the last one records


def _fake(node):
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


def _is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def api_of(node, table):
    """(prefix, api) that eager mode records for `node`, (UNMAPPED, name) for a torch operation on tensors
    that is no API of the list, or None for what is no call of the user's on tensors (a tuple's item, a size)."""
    target = node.target
    if node.op == "call_method":
        func = getattr(torch.Tensor, target, None)
        entry = table.get(func) if func is not None else None
        name = target
    else:
        if target in OPERATORS:
            if not any(_is_tensor(_fake(a)) for a in node.args):  # a tuple's item, a size's arithmetic
                return None
            func = getattr(torch.Tensor, OPERATORS[target], None)
            entry = table.get(func) if func is not None else None
        else:
            entry = table.get(target)
        name = getattr(target, "__name__", str(target))
    if entry is not None and entry.__class__ is tuple:
        return entry[0], entry[1]
    value = _fake(node)
    outputs = [value] if _is_tensor(value) else list(value) if isinstance(value, (tuple, list)) else []
    if not any(_is_tensor(v) for v in outputs):
        return None
    return UNMAPPED, name


class _Plan:
    """What a graph records: per API call, its key and the templates of its inputs and outputs, whose tensor
    leaves are ("t", slot, dtype, shape, requires_grad) (slot: the tensor's row of the statistics output)."""

    def __init__(self):
        self.calls = []  # (key, args, kwargs, output, index of the parent module call in `modules` or None)
        self.modules = []  # the module calls inside the graph, in order: (path under the compiled module,
        #                    class name, index of the parent module call or None)
        self.slots = {}  # (node, index or None) -> slot
        self.stats = []  # the statistics nodes, in order: slots are offsets in their concatenation
        self.width = 0
        self.dynamic = False  # some recorded tensor has dynamic sizes (read with the statistics)
        self.frames = []  # per call: its source frames inside the compiled code, innermost first
        self.sizes = []  # per call: (tensors it takes, tensors it returns): its backward record's lengths
        self.grads = {}  # (node, index) -> [(call, key, index)]: where each tensor's gradient goes
        self.taps = []  # per tap id: (places, dtype, shape) (compiled_backward.add_taps)
        self.id = None  # the id of the taps' plan in compiled_backward.PLANS, if it has taps
        self.run = None  # the latest forward run's _Run, while a debugger records it


def _tensor_key(node, index):
    """One key per tensor of the graph: an item of a tuple-valued call is (call, index), however reached."""
    if index is None and node.op == "call_function" and node.target is operator.getitem \
            and isinstance(node.args[0], torch.fx.Node) and isinstance(_fake(node.args[0]), (tuple, list)) \
            and isinstance(node.args[1], int):
        return node.args[0], node.args[1]
    return node, index


class _Run:
    """One forward run of a graph: its calls' names and parents, and the backward records made from them."""

    __slots__ = ("names", "parents", "backward")

    def __init__(self, names, parents):
        self.names = names
        self.parents = parents
        self.backward = {}  # call index -> its backward record


def instrument(gm, table, encode_constant, backward=False, frames_of=None):
    """Adds the statistics output to `gm` in place (and with `backward`, the taps of compiled_backward.py);
    returns the _Plan, or None when nothing is recorded. `frames_of(node)` gives a call's source frames."""
    graph = gm.graph
    output = next(n for n in graph.nodes if n.op == "output")
    if not isinstance(output.args[0], (tuple, list)):
        return None
    plan = _Plan()
    nodes = list(graph.nodes)
    last_placeholder = max((i for i, n in enumerate(nodes) if n.op == "placeholder"), default=-1)
    last = {}  # node -> the last node inserted after it
    writes = any(map(compiled_backward.writes_in_place, nodes))
    reading = [None]  # the call whose inputs are being read, in a graph that writes in place

    def slot(node, index=None, at=None):
        """The statistics row of tensor `node` (item `index` of a tuple-valued node), computed just after
        the node (or after node `at`): an in-place call later on does not change what was recorded. In a
        graph that writes tensors in place, a call's inputs are read just before it (`before`)."""
        before = reading[0]
        key = (node, index, at, before)
        if key not in plan.slots:
            fake = _fake(node) if index is None else _fake(node)[index]
            sized = not all(isinstance(d, int) for d in fake.shape)  # dynamic: its sizes are read too
            if not sized and fake.numel() == 0:  # empty: no statistics
                plan.slots[key] = None
                return None
            func = compiled_stats.stats_of_sized if sized else compiled_stats.stats_of
            width = compiled_stats.STATS_WIDTH
            offset, plan.width = plan.width, plan.width + (width + 1 + fake.dim() if sized else width)
            if before is not None:
                with graph.inserting_before(before):
                    source = node
                    if index is not None:
                        source = graph.call_function(operator.getitem, (node, index))
                        source.meta["example_value"] = fake
                    row = graph.call_function(func, (source,))
                plan.slots[key] = offset
                plan.stats.append(row)
                return offset
            after = at if at is not None else node if node.op != "placeholder" else nodes[last_placeholder]
            anchor, after = after, last.get(after, after)
            with graph.inserting_after(after):
                source = node
                if index is not None:
                    source = graph.call_function(operator.getitem, (node, index))
                    source.meta["example_value"] = fake
            with graph.inserting_after(after if source is node else source):
                row = graph.call_function(func, (source,))
            last[anchor] = row  # the next row of this node goes after this one: graph order kept
            plan.slots[key] = offset
            plan.stats.append(row)
        return plan.slots[key]

    seen = []  # the tensors of the call's inputs or outputs, in order: (node, index), or None (not tapped)

    def leaf(value, node=None, index=None, at=None):
        fake = _fake(node) if index is None else _fake(node)[index]
        shape = tuple(int(d) if isinstance(d, int) else None for d in fake.shape)
        plan.dynamic = plan.dynamic or None in shape
        seen.append(_tensor_key(node, index) if at is None else None)
        return ("t", slot(node, index, at), str(fake.dtype), shape, bool(fake.requires_grad))

    def template(value):
        if isinstance(value, torch.fx.Node):
            fake = _fake(value)
            if _is_tensor(fake):
                return leaf(value, value)
            if isinstance(fake, (int, float, bool)) and not isinstance(fake, torch.SymInt):
                return {"type": type(fake).__name__, "value": fake}
            return {"type": type(fake).__name__ if fake is not None else "unknown"}
        if isinstance(value, (tuple, list)):
            return [template(v) for v in value]
        if isinstance(value, dict):
            return {str(k): template(v) for k, v in value.items()}
        return encode_constant(value)

    instances = {}  # nn_module_stack key -> index in plan.modules
    for node in nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        key = api_of(node, table)
        if key is None:
            continue
        fake = _fake(node)
        if node.target is operator.setitem:  # x[i] = y: its output is x, after (as eager records it)
            out = [leaf(None, node.args[0], at=node)]
        elif _is_tensor(fake):
            out = [leaf(None, node)]
        elif isinstance(fake, (tuple, list)):
            out = [leaf(None, node, i) if _is_tensor(v) else template(v) for i, v in enumerate(fake)]
        else:
            out = [template(fake)]
        outs = list(seen)
        seen.clear()
        parent = module_calls(node, plan, instances)
        args, kwargs = as_dispatched(node)
        reading[0] = node if writes else None
        plan.calls.append((key, template(list(args)), template(dict(kwargs)), out, parent))
        reading[0] = None
        ins = list(seen)
        seen.clear()
        k = len(plan.calls) - 1
        plan.sizes.append((len(ins), len(outs)))
        plan.frames.append(frames_of(node) if frames_of is not None else ())
        for what, tensors in (("output", ins), ("input", outs)):
            for i, tensor in enumerate(tensors):
                if tensor is not None:
                    plan.grads.setdefault(tensor, []).append((k, what, i))
    if not plan.calls:
        return None
    if backward:
        original = set(nodes)
        inserted = set(plan.stats) | {row.args[0] for row in plan.stats if row.args[0] not in original}
        compiled_backward.add_taps(graph, plan, _fake, inserted)
    with graph.inserting_before(output):
        rows = graph.call_function(torch.cat, (plan.stats,)) if plan.stats else \
            graph.call_function(torch.zeros, (0,), {"dtype": torch.float64})
    outs = output.args[0]
    output.args = (type(outs)([*outs, rows]),)
    graph.lint()
    gm.recompile()
    return plan


class _Seen(Exception):
    pass


class _Probe(torch.overrides.TorchFunctionMode):
    """Takes the arguments of the first call dispatched to a mode, and stops it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        raise _Seen(args, kwargs or {})


def as_dispatched(node):
    """(args, kwargs) of `node` as the API capture's mode sees them in eager mode: a Python function of
    torch.nn.functional hands its tensors positionally and the rest by keyword (`F.layer_norm(x, shape, w, b,
    eps)` reaches the mode as `(x, shape), weight=w, bias=b, eps=eps`), where dynamo's graph keeps the call as
    written. Found by calling the target once on meta tensors under a mode that stops at the first dispatch."""
    if node.op != "call_function" or not isinstance(getattr(node.target, "__code__", None), types.CodeType):
        return node.args, node.kwargs
    nodes = {}

    def meta(value):
        if isinstance(value, torch.fx.Node):
            fake = _fake(value)
            if not _is_tensor(fake) or not all(isinstance(d, int) for d in fake.shape):
                raise _Seen(None)
            t = torch.empty(fake.shape, dtype=fake.dtype, device="meta")
            nodes[id(t)] = (t, value)
            return t
        if isinstance(value, (tuple, list)):
            return type(value)(meta(v) for v in value)
        return value

    def back(value):
        if isinstance(value, torch.Tensor):
            return nodes[id(value)][1]  # KeyError: a tensor made inside the function
        if isinstance(value, (tuple, list)):
            return type(value)(back(v) for v in value)
        if isinstance(value, dict):
            return {k: back(v) for k, v in value.items()}
        return value

    try:
        args, kwargs = meta(node.args), {k: meta(v) for k, v in node.kwargs.items()}
        with _Probe():
            node.target(*args, **kwargs)
    except _Seen as seen:
        if len(seen.args) == 2:
            try:
                return back(tuple(seen.args[0])), back(seen.args[1])
            except KeyError:
                pass
    except Exception:  # noqa: BLE001 - the call as the graph has it
        pass
    return node.args, node.kwargs


def module_path(path: str) -> str:
    """A path of dynamo's nn_module_stack (`L['self'].blocks.0.ln`, `L['self'].blocks[0]`) as the path under
    the compiled module (`blocks.0.ln`); "" for the compiled module itself."""
    path = re.sub(r"^[LG]\[[^\]]*\]", "", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\[['\"]([^'\"]*)['\"]\]", r".\1", path)
    return path.strip(".")


def module_calls(node, plan, instances):
    """The index in plan.modules of the innermost module call that made `node` (added with its outer ones),
    or None for a call of the compiled module's own code."""
    parent = None
    for key, entry in (node.meta.get("nn_module_stack") or {}).items():
        path, cls = entry if isinstance(entry, tuple) and len(entry) == 2 else (None, None)
        if not isinstance(path, str):
            continue
        path = module_path(path)
        if not path:
            continue
        if key not in instances:
            instances[key] = len(plan.modules)
            plan.modules.append((path, getattr(cls, "__name__", str(cls)), parent))
        parent = instances[key]
    return parent


def wrap(compiled, plan):
    """The compiled function without its statistics output, which goes to the collecting debugger."""
    def run(*args, **kwargs):
        out = compiled(*args, **kwargs)
        deliver(plan, out)
        return out[:-1]
    if getattr(compiled, "_boxed_call", False):  # called with one list that it empties, as `compiled` is
        run._boxed_call = True
    run.__wrapped__ = compiled
    return run


def _fill(template, read):
    if isinstance(template, tuple):
        return read(template)
    if isinstance(template, list):
        return [_fill(v, read) for v in template]
    if isinstance(template, dict) and "type" not in template:
        return {k: _fill(v, read) for k, v in template.items()}
    return template


def deliver(plan, out) -> None:
    """A run of the graph returned `out` (its statistics last)."""
    plan.run = None  # a backward from now on follows this run: named after it only if it is recorded
    if not ACTIVE:
        return
    capture = ACTIVE[-1]
    session = capture.session
    if not session.forward_on or session.thread != get_ident():
        return
    try:
        with capture.recorder._quiet():
            record_calls(capture, plan, out[-1])
    except Exception as exc:  # noqa: BLE001 - never break the user's step
        report_failure("compiled capture", exc, site="compiled_capture.deliver")


def record_calls(capture, plan, rows) -> None:
    session, recorder = capture.session, capture.recorder
    read = compiled_stats.reader(rows, plan.dynamic, session.pending)
    counters, flt, filtered = session.counters, session.filter, recorder.filtered
    outer = capture.modules.current() if capture.modules is not None else None
    parent = outer.name if outer is not None else None
    names = []  # the module calls of the graph, named as eager mode names them: parents in construct.json
    if capture.modules is not None and plan.modules:
        kind = capture.modules.kind
        base = ".".join(parent.split(".")[1:-3]) if parent is not None else ""
        for path, cls, up in plan.modules:
            full = f"{base}.{path}" if base else path
            name = module_record(kind, full, cls, FORWARD, session.next_index((kind, full)))
            names.append(name)
            if recorder.parents:
                session.construct[name] = names[up] if up is not None else parent
    stacks = session.stacks if recorder.extra else None
    if stacks is not None:
        frame = sys._getframe()
        walk = stacks.outer_walk(frame)
    run = _Run([], [])
    for (key, args, kwargs, out, up), inner in zip(plan.calls, plan.frames):
        n = counters.get(key, 0)
        counters[key] = n + 1
        name = f"{key[0]}.{key[1]}.{n}.{FORWARD}"
        up_name = names[up] if up is not None and names else parent
        run.names.append(name)
        run.parents.append(up_name)
        if filtered:
            flt.on_start(name)
            if not flt.wants(name):
                flt.on_end(name)
                continue
        record = Record(name)
        if recorder.inputs:
            record.data["input_args"], record.data["input_kwargs"] = _fill(args, read), _fill(kwargs, read)
        if recorder.outputs:
            record.data["output"] = _fill(out, read)
        if recorder.parents:
            session.construct[name] = up_name
        if not session.numbers or record.data:
            session.records[name] = record
            session.dirty = True
            if stacks is not None:
                stacks.file_inside(name, inner, walk, frame)
        if filtered:
            flt.on_end(name)
    if plan.id is not None:
        plan.run = run


def _on_gradient(rows, taps) -> None:
    if not ACTIVE:
        return
    capture = ACTIVE[-1]
    try:
        with capture.recorder._quiet():
            compiled_backward.on_gradient(capture, rows, taps)
    except Exception as exc:  # noqa: BLE001 - never break the user's backward
        report_failure("compiled backward capture", exc, site="compiled_capture._on_gradient")


def _recording() -> bool:
    return bool(ACTIVE) and ACTIVE[-1].session.step_open


compiled_backward._SINK.update(on_gradient=_on_gradient, recording=_recording)


_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+), in ([^\n]+)\n([^\n]*)')


def frames_of(node, is_user_file) -> tuple:
    """A graph call's source frames from dynamo's metadata (`stack_trace`, outermost first), as (file, line,
    function, source) innermost first, the user's files only."""
    trace = node.meta.get("stack_trace") or ""
    found = [(file, int(line), function.strip(), source.strip())
             for file, line, function, source in _TRACE_LINE.findall(trace) if is_user_file(file)]
    return tuple(reversed(found))


def _call_user_compiler(self, gm, example_inputs):
    original = _state["original"]
    if not _state.get("keep"):
        return original(self, gm, example_inputs)
    graph = copy.deepcopy(gm.graph)  # the graph as it came: compiled if ours fails
    try:
        return _compile(self, gm, example_inputs, _state["backward"])
    except Exception as exc:  # noqa: BLE001 - the graph is compiled as it came
        report_failure("compiled capture", exc, site="compiled_capture.instrument")
    gm.graph = graph
    gm.recompile()
    return original(self, gm, example_inputs)


def _compile(self, gm, example_inputs, backward):
    """The user's backend's compilation of `gm` with its statistics (and with `backward`, its gradients')."""
    before = set(gm.graph.nodes)
    plan = instrument(gm, _state["table"], _state["encode"], backward, _state["frames"])
    if plan is None:
        return _state["original"](self, gm, example_inputs)
    for node in gm.graph.nodes:
        if node not in before:
            compiled_partition.tag(node)
    return wrap(_state["original"](self, gm, example_inputs), plan)


@guarded("start()")
def install(capture) -> bool:
    """Once dynamo is imported, at start() at L1/mix: graphs compiled from now on carry their statistics.
    Returns whether the compiler is wrapped (False before dynamo is imported, or where dynamo has no
    `OutputGraph.call_user_compiler`: then compiled code keeps being one record at its edge)."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo import output_graph
    owner = getattr(output_graph, "OutputGraph", None)
    if owner is None or not callable(getattr(owner, "call_user_compiler", None)):
        return False
    if _state["original"] is None:
        _state["original"], _state["owner"] = owner.call_user_compiler, owner
        owner.call_user_compiler = _call_user_compiler
        compiled_partition.install()
        _said_compiled_before()
    session = capture.session
    _state["table"] = capture.table
    _state["encode"] = _constant_encoder(capture)
    _state["backward"] = BACKWARD in session.filter.directions
    stacks = session.stacks
    _state["frames"] = lambda node: frames_of(node, stacks.is_user_file)
    _state["keep"] = True
    return True


EARLY_MESSAGE = ("%d function(s) compiled by torch.compile before the debugger started: calls inside them are "
                 "not recorded. Start the debugger before the first compiled call")


def _said_compiled_before() -> None:
    """Graphs that dynamo compiled before the compiler was wrapped run from its cache without statistics:
    said once, not silently missing."""
    frames = sys.modules.get("torch._dynamo.convert_frame")
    try:
        count = len(frames.output_codes.seen_ids)  # the frames compiled since the last torch._dynamo.reset()
    except Exception:  # noqa: BLE001 - not known in this PyTorch: nothing said
        count = 0
    if count:
        log.warning(EARLY_MESSAGE, count)


def _constant_encoder(capture):
    encoder = capture.summarizer.encoder
    return lambda value: encoder.encode(value, lambda t, path: None)


def activate(capture) -> None:
    if capture not in ACTIVE:
        ACTIVE.append(capture)


def deactivate(capture) -> None:
    if capture in ACTIVE:
        ACTIVE.remove(capture)


def uninstall() -> None:
    """When no debugger at L1/mix is left: dynamo's compiler as it was (compiled graphs keep their output)."""
    if _state["original"] is not None and not ACTIVE:
        _state["owner"].call_user_compiler = _state["original"]
        _state["original"] = _state["owner"] = None
        compiled_partition.uninstall()
        _state["keep"] = False
