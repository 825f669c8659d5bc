"""Backward records of graphs whose backward inductor compiles: its backward program replayed (issue 31).

Inductor fuses a backward program into kernels that keep no intermediate gradients, and reading one inside
the program changes how it fuses (and so the gradients' last bits). So the gradient taps of
compiled_backward.py are taken out of the joint graph before inductor splits it (`take_taps`: the split and
the kernels are those of the run without the debugger), and the backward program that inductor is given gets
one op at its start (`attach`): it hands the program's inputs (the values the forward saved, the incoming
gradients) to a copy of the same program that computes the tapped gradients' statistics, while a debugger
records the step. The replay reads the inputs before inductor's kernels run and writes nothing: the compiled
backward's results are its own. Its gradients are those of the same ATen ops, computed from the compiled
forward's saved values by inductor's own compilation of the replay (made at its first run); it costs one
more backward per recorded step, and nothing otherwise.
"""
from __future__ import annotations

import operator

import torch

from ..core.safety import report_failure
from . import compiled_backward, compiled_stats

REPLAYS = []  # every attached replay, by its id in the op's arguments (graphs live for the process)


def _replay_backward(replay: int, tensors: list[torch.Tensor], sizes: list[int]) -> None:
    REPLAYS[replay](tensors, sizes)


REPLAY = compiled_backward.effectful_op("replay_backward", _replay_backward)


def _is_tap(node) -> bool:
    sink = getattr(compiled_backward.GRADIENT_STATS, "default", None)
    return sink is not None and node.op == "call_function" and "with_effects" in str(node.target) \
        and len(node.args) > 4 and node.args[1] is sink


def take_taps(gm):
    """Takes compiled_backward's taps out of joint graph `gm`, in place: each tap's statistics, its side effect
    and its token (the token's placeholder and output stay, passed through). Returns [(gradient's node name,
    plan id, tap id)] and the taps' effect node's metadata, or None when `gm` has no taps."""
    graph = gm.graph
    taps = [n for n in graph.nodes if _is_tap(n)]
    if not taps:
        return None
    found, meta = [], dict(taps[0].meta)
    for effect in taps:
        stats = _statistics_of(effect)
        sources = [n for s in stats for n in s.all_input_nodes
                   if n not in stats and isinstance(n.meta.get("val"), torch.Tensor)]
        if len(set(sources)) == 1:
            found.append((sources[0].name, effect.args[3], effect.args[4]))
        token = effect.args[0]
        for user in list(effect.users):  # getitem(effect, 0): the token after the effect
            user.replace_all_uses_with(token)
            graph.erase_node(user)
        graph.erase_node(effect)
        for node in sorted(stats, key=_order(graph), reverse=True):
            if not node.users:
                graph.erase_node(node)
    gm.recompile()
    return found, meta


def _order(graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return index.__getitem__


def _statistics_of(effect) -> set:
    """The nodes that compute a tap's statistics: those whose every use leads to the tap's effect only."""
    stats, todo = set(), [effect.args[2]]
    while todo:
        node = todo.pop()
        if node in stats or node.op == "placeholder":
            continue
        if all(u in stats or u is effect for u in node.users):
            stats.add(node)
            todo.extend(node.all_input_nodes)
    return stats


def attach(bw, taps, meta, remake) -> None:
    """Gives backward program `bw` (inductor's split, with the taps' token passed through) the op that replays
    it with `taps` ([(gradient's node name, plan id, tap id)]) on its inputs. `remake(name, by_name, graph)`
    adds to `graph` the joint graph's recipe of a gradient that a joint-graph pass fused away, or gives None."""
    graph = bw.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    token = next((n for n in placeholders if n.name.startswith("tangents_token")), None)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    if token is None or REPLAY is None or token not in output.all_input_nodes:
        return
    inputs = [n for n in placeholders if n is not token]
    replay = _Replay(bw, inputs, taps, remake)
    if not replay.taps:
        return
    tensors = [n for n in inputs if isinstance(n.meta.get("val"), torch.Tensor)]
    sizes = [n for n in inputs if n not in tensors]
    replay.order = [("t", tensors.index(n)) if n in tensors else ("s", sizes.index(n)) for n in inputs]
    replay.id = len(REPLAYS)
    REPLAYS.append(replay)
    with graph.inserting_after(placeholders[-1]):
        effect = graph.call_function(torch.ops.higher_order.with_effects,
                                     (token, REPLAY.default, replay.id, tensors, sizes))
    effect.meta.update(meta)
    with graph.inserting_after(effect):
        after = graph.call_function(operator.getitem, (effect, 0))
    after.meta["val"] = token.meta.get("val")
    output.replace_input_with(token, after)
    graph.lint()
    bw.recompile()


class _Replay:
    """A copy of a backward program that computes only what the taps read and returns the tapped gradients'
    statistics as one float64 vector (as the forward's statistics output), compiled by inductor on its first
    run (eagerly where that fails). It never draws random numbers (that would move the user's generator): a
    gradient that depends on a random op of the program has no statistics."""

    def __init__(self, bw, inputs, taps, remake):
        graph = torch.fx.Graph()
        env = {}
        for node in bw.graph.nodes:
            if node.op == "placeholder" and node in inputs:
                env[node] = graph.placeholder(node.name)
            elif node.op in ("call_function", "get_attr") and all(n in env for n in node.all_input_nodes) \
                    and torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
                env[node] = graph.node_copy(node, env.__getitem__)
        by_name = {n.name: copied for n, copied in env.items()}
        self.taps, rows, width = [], [], 0  # taps: (plan id, tap id, offset in the statistics vector)
        for name, plan, tap in taps:
            source = by_name.get(name) or remake(name, by_name, graph)
            if source is None:  # fused away, and not to be remade: no statistics for this gradient
                continue
            shape = compiled_backward.PLANS[plan].taps[tap][2]
            sized = None in shape  # its record reads the sizes too
            rows.append(graph.call_function(compiled_stats.stats_of_sized if sized else compiled_stats.stats_of,
                                            (source,)))
            size = compiled_stats.STATS_WIDTH + (1 + len(shape) if sized else 0)
            self.taps.append((plan, tap, width))
            width += size
        graph.output(graph.call_function(torch.cat, (rows,)) if rows else ())
        graph.eliminate_dead_code()
        self.module = torch.fx.GraphModule(bw, graph)
        self.runners = {}  # the inputs' sizes and layouts -> the replay compiled for them
        self.order, self.id = [], None

    def __call__(self, tensors, sizes):
        if not compiled_backward.recording():
            return
        try:
            args = [tensors[i] if kind == "t" else sizes[i] for kind, i in self.order]
            with torch.no_grad():
                rows = self._run(args)
            compiled_backward.deliver(rows, self.taps)
        except Exception as exc:  # noqa: BLE001 - the compiled backward runs on
            report_failure("compiled backward replay", exc, site="compiled_replay.replay")

    def _run(self, args):
        """The statistics, by inductor's compilation of the replay for these inputs' sizes and layouts (made on
        their first run, for up to 8 of them), or eagerly: with dynamic sizes, or where inductor cannot compile
        it (said once)."""
        key = tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else None for a in args)
        runner = self.runners.get(key)
        if runner is None:
            runner = self.module
            if None not in key and len(self.runners) < 8:
                try:
                    from torch._inductor.compile_fx import compile_fx  # noqa: PLC0415 - inductor on first use
                    runner = compile_fx(self.module, args)
                except Exception as exc:  # noqa: BLE001 - replayed eagerly
                    report_failure("compiling the backward's replay (replayed eagerly)", exc,
                                   site="compiled_replay.run")
            self.runners[key] = runner
        return runner(*args)
