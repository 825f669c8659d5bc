"""The forward statistics kept out of inductor's split of a training graph (issue 31).

Inductor splits a training graph into a forward and a backward program: which values the forward saves and
which the backward recomputes is decided by heuristics that look at each node's users and position in the
joint graph (functorch's min-cut partitioner, and the joint-graph passes before it). Statistics nodes are users
of the graph's tensors: on some models (GPT-2's tanh GELU, Llama) they move a decision, the backward
recomputes a value in another kernel, and gradients change in the last bits. So while graphs are
instrumented, inductor's `partition_fn` is wrapped: the forward statistics (the nodes the debugger added, whose
result is the graph's statistics output) are taken out of the joint graph, the graph is split as it would be
without the debugger, and the same nodes are put back into the forward program, reading the same values.
The gradient taps (compiled_backward.py) leave the joint graph too, for a replay of the backward program
(compiled_replay.py). A value that the split no longer has in the forward (a joint-graph pass
fused it away) has no statistics (NaN, recorded as missing).
"""
from __future__ import annotations

import sys

import torch

from ..core.safety import log
from . import compiled_replay

TAG = "msprobe_lite"  # node.meta["custom"][TAG]: a node the debugger added (the tracer carries it over)
_state = {"original": None, "owner": None}


def tag(node) -> None:
    node.meta["custom"] = dict(node.meta.get("custom") or {}, **{TAG: True})


def ours(node) -> bool:
    return bool((node.meta.get("custom") or {}).get(TAG))


def install() -> None:
    """Wraps inductor's partition_fn, where this PyTorch has one (otherwise the statistics stay in the joint
    graph, as for the other backends, whose splits do not weigh users)."""
    owner = sys.modules.get("torch._inductor.compile_fx")
    if owner is None:
        try:
            from torch._inductor import compile_fx as owner
        except Exception:  # noqa: BLE001 - no inductor: nothing to keep
            return
    if _state["original"] is None and callable(getattr(owner, "partition_fn", None)):
        _state["original"], _state["owner"] = owner.partition_fn, owner
        owner.partition_fn = partition_fn


def uninstall() -> None:
    if _state["original"] is not None:
        _state["owner"].partition_fn = _state["original"]
        _state["original"] = _state["owner"] = None


def partition_fn(gm, joint_inputs, **kwargs):
    original = _state["original"]
    taps = compiled_replay.take_taps(gm)
    joint = _named(gm.graph) if taps is not None else None
    taken = take_out(gm, kwargs.get("num_fwd_outputs"))
    fw, bw = original(gm, joint_inputs, **kwargs)
    if taken is not None:
        put_back(fw, *taken)
    if taps is not None:
        compiled_replay.attach(bw, *taps, lambda name, by_name, graph: remake(name, by_name, joint, graph))
    return fw, bw


def _named(graph) -> dict:
    """A copy of `graph`, as name -> node: the recipes of values that later passes remove."""
    snapshot = torch.fx.Graph()
    snapshot.graph_copy(graph, {})
    return {n.name: n for n in snapshot.nodes}


def take_out(gm, forward_outputs):
    """Takes the forward statistics out of joint graph `gm` (whose first `forward_outputs` outputs are the
    forward's): each statistics output becomes an empty tensor of the same device. Returns (statistics graph,
    {empty's name: statistics output}), or None when it has none."""
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    joint = _named(graph)  # the joint graph as it came: how to remake a value the split left out
    outs = output.args[0]
    if not isinstance(forward_outputs, int) or not isinstance(outs, (tuple, list)):
        return None
    rows = [n for n in outs[:forward_outputs] if isinstance(n, torch.fx.Node) and ours(n)]
    if not rows:
        return None
    needed, todo = set(), list(rows)
    while todo:
        node = todo.pop()
        if node not in needed and ours(node) and node.op != "placeholder":
            needed.add(node)
            todo.extend(node.all_input_nodes)
    shrinking = True  # a node that something else uses too (a view the tracer shares) stays, as an input
    while shrinking:
        shared = {n for n in needed if any(u not in needed and u is not output for u in n.users)}
        shrinking = bool(shared)
        needed -= shared
    if not all(row in needed for row in rows):
        return None
    order = [n for n in graph.nodes if n in needed]
    held = torch.fx.Graph()
    env = {}
    for node in order:
        for source in node.all_input_nodes:
            if source not in needed and source not in env:
                env[source] = held.placeholder(source.name)
                env[source].meta = dict(source.meta)
        env[node] = held.node_copy(node, lambda n: env[n])
    stand_ins = {}
    for row in rows:
        val = row.meta.get("val")
        with graph.inserting_before(output):
            empty = graph.call_function(torch.ops.aten.empty.memory_format, ([0],), {
                "dtype": torch.float64, "device": val.device if isinstance(val, torch.Tensor) else None})
        if isinstance(val, torch.Tensor):
            empty.meta["val"] = val.new_empty((0,))
        output.replace_input_with(row, empty)
        stand_ins[empty.name] = env[row]
    for node in reversed(order):
        graph.erase_node(node)
    gm.recompile()
    held.output(tuple(env[row] for row in rows))
    return held, stand_ins, joint


def put_back(fw, held, stand_ins, joint) -> None:
    """Puts the statistics back into forward program `fw`, reading its values by name, in place of the empty
    tensors that stood for them. A value the forward no longer has (a view the backward remakes) is remade
    from the joint graph's recipe (`joint`: name -> node) where the forward has its inputs."""
    graph = fw.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    by_name = {n.name: n for n in graph.nodes}
    with graph.inserting_before(output):
        env = {n: remake(n.target, by_name, joint, graph) for n in held.nodes if n.op == "placeholder"}
    missing = any(found is None for found in env.values())
    with graph.inserting_before(output):
        for node in held.nodes:
            if node.op not in ("placeholder", "output") and not missing:
                env[node] = graph.node_copy(node, lambda n: env[n])
        for name, row in stand_ins.items():
            empty = by_name.get(name)
            if empty is None or empty not in output.all_input_nodes:
                continue
            if missing:  # a value fused away: statistics NaN
                val = row.meta.get("val")
                value = graph.call_function(torch.ops.aten.full.default, (list(val.shape), float("nan")), {
                    "dtype": torch.float64, "device": val.device})
                value.meta["val"] = val
            else:
                value = env[row]
            output.replace_input_with(empty, value)
            if not empty.users:
                graph.erase_node(empty)
    fw.recompile()


def remake(name, by_name, joint, graph, depth=0):
    """The forward's node named `name`, or a copy of the joint graph's, its inputs remade the same way; None
    where that reaches an input the forward lacks (or more than 32 nodes deep)."""
    found = by_name.get(name)
    if found is not None or depth > 32:
        return found
    recipe = joint.get(name)
    if recipe is None or recipe.op != "call_function" or \
            torch.Tag.nondeterministic_seeded in getattr(recipe.target, "tags", ()):  # never draw random numbers
        return None
    inputs = {n: remake(n.name, by_name, joint, graph, depth + 1) for n in recipe.all_input_nodes}
    if any(v is None for v in inputs.values()):
        return None
    by_name[name] = graph.node_copy(recipe, lambda n: inputs[n])
    return by_name[name]
