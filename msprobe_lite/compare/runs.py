"""One call in one framework, several in the other (issue 32): PyTorch's `nn.Conv2d` runs `Functional.conv2d`,
MindSpore's runs `Primitive.Conv2D` then `Primitive.BiasAdd` (`nn.Dense`: `MatMul`, `BiasAdd`). By name and
signature nothing pairs them. Where, in one paired module (cell), or between two paired records, calls of one
direction paired with nothing - one on one side, a run of one or more on the other - the run is read as one
call: the first call's inputs,
the last call's outputs (as one call of the other side takes and gives them), and paired with the single
call when their first input's and first output's shapes agree and its first input's statistics are close.
Generally, not by a list of known pairs; runs of at most three calls.
"""
from __future__ import annotations

from .pair import Pair, is_module, split_name

RUN_INPUTS_CLOSE = 0.05  # a run's first inputs and the call's: within 5% of their magnitude (bf16 against fp32)


def join_runs(pairs: list, target, golden) -> list:
    """`pairs` with each such run joined to its single call (the joined records replace the run's first
    record in its dump; the run's other calls are named in the pair's `joined`)."""
    module_of = {p.golden: p.target for p in pairs if p.target and p.golden and is_module(p.target)}
    paired_modules = set(module_of.values())
    sides = {}  # (where, direction) -> ([target-only calls], [golden-only calls])
    gap = 0
    for p in pairs:
        if p.target is not None and p.golden is not None:
            gap += 1
            continue
        name, dump = (p.target, target) if p.target is not None else (p.golden, golden)
        direction = split_name(name)[1]
        if direction is None or is_module(name):
            continue
        # where: the paired module around it (at mix a module's backward record falls between its calls'),
        # else the stretch between two paired records
        parent = dump.parents.get(name)
        parent = parent if p.target is not None else module_of.get(parent)
        where = parent if isinstance(parent, str) and parent in paired_modules else gap
        sides.setdefault((where, direction), ([], []))[0 if p.target is not None else 1].append(name)
    joined = {}  # target or golden name -> the Pair that replaces its unmatched one
    for t_calls, g_calls in sides.values():
        if not t_calls or not g_calls or (len(t_calls) > 1 and len(g_calls) > 1) or len(t_calls) + len(g_calls) > 4:
            continue
        run_side, run, one_side, one = (target, t_calls, golden, g_calls[0]) if len(t_calls) > 1 or \
            len(g_calls) == 1 else (golden, g_calls, target, t_calls[0])
        record = _as_one(run_side, run)
        if record is None or not _same_ends(record, one_side.records.get(one)):
            continue
        run_side.records[run[0]] = record
        run_side._rows.pop(run[0], None)
        pair = Pair(run[0], one, "aligned", tuple(run[1:])) if run_side is target else \
            Pair(one, run[0], "aligned", tuple(run[1:]))
        for name in (*run, one):
            joined[name] = pair
    if not joined:
        return pairs
    result, placed = [], set()
    for p in pairs:
        pair = joined.get(p.target if p.target is not None else p.golden) if p.target is None or p.golden is None \
            else None
        if pair is None:
            result.append(p)
        elif id(pair) not in placed:
            placed.add(id(pair))
            result.append(pair)
    return result


def _as_one(dump, run: list):
    """The run as one record: its first call's inputs, its last call's outputs; None if they are not there."""
    first, last = dump.records.get(run[0]), dump.records.get(run[-1])
    if not isinstance(first, dict) or not isinstance(last, dict):
        return None
    if split_name(run[0])[1] == "backward":
        return {"input": first.get("input"), "output": last.get("output")}
    return {"input_args": first.get("input_args"), "input_kwargs": first.get("input_kwargs") or {},
            "output": last.get("output")}


def _first_tensor(value):
    if isinstance(value, dict):
        if "shape" in value and "dtype" in value:
            return value
        return next((t for t in map(_first_tensor, value.values()) if t is not None), None)
    if isinstance(value, list):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


def _same_ends(record: dict, other) -> bool:
    """Whether two records take a first tensor of one shape and close values, and give a first tensor of one
    shape: the same call's ends (a call of another place takes other values)."""
    if not isinstance(other, dict):
        return False
    ins = [_first_tensor(r.get("input_args", r.get("input"))) for r in (record, other)]
    outs = [_first_tensor(r.get("output")) for r in (record, other)]
    if not all(a is not None and b is not None and a.get("shape") == b.get("shape") for a, b in (ins, outs)):
        return False
    a, b = ins
    values = [(a.get(k), b.get(k)) for k in ("Max", "Min", "Mean")]
    if not all(isinstance(x, (int, float)) and isinstance(y, (int, float)) for x, y in values):
        return True  # no statistics (md5, a tensor not read): the shapes decide
    size = max(abs(v) for pair in values for v in pair) or 1.0
    return all(abs(x - y) <= RUN_INPUTS_CLOSE * size for x, y in values)
