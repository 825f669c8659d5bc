"""overflow_check analysis: per rank, the first call whose inputs are finite and whose outputs hold NaN/Inf, or
before it, the first use of a weight that already holds NaN/Inf."""
from __future__ import annotations

import json
import math
import os

from ..core.naming import params_grad_calls
from ..core.writer import write_atomic
from . import console, nonfinite
from .metrics import finite
from .pair import split_name
from .read import DumpError, load_dump, place, resolve
from .report import at, output_folder, unwritable
from .rows import INPUT, OUTPUT


def _finite_row(row) -> bool:
    """A tensor's statistics, or a float argument's value (a `-inf` fill value), hold no NaN/Inf."""
    if row.is_tensor:
        return finite(row.obj)
    value = row.obj.get("value") if isinstance(row.obj, dict) else None
    return not isinstance(value, float) or math.isfinite(value)


def _made_from(dump, name: str, rows) -> list:
    """The rows a record's outputs are made from: its inputs. Parameter gradients have none of their own:
    they are made of each of their module's calls' backward input gradients and forward inputs
    (grad_out^T x), and those backwards' outputs must be finite too, or a backward made the NaN/Inf."""
    calls = params_grad_calls(name, dump.records)
    if calls is None:
        return [r for r in rows if r.role == INPUT]
    forwards, backwards = calls
    return [*(r for n in backwards for r in dump.rows(n)),
            *(r for n in forwards for r in dump.rows(n) if r.role == INPUT)]


def first_overflow(dump) -> tuple:
    """(the first call whose inputs and arguments are finite and whose outputs hold NaN/Inf, the first call
    whose outputs hold NaN/Inf at all), each a dict or None. A call that turns a non-finite argument into a
    non-finite output (a causal mask: `masked_fill(mask, float("-inf"))`) made nothing overflow."""
    first_seen = None
    for name in dump.records:
        rows = dump.rows(name)   # a malformed record is a DumpError naming the file
        bad = [r.name for r in rows if r.role == OUTPUT and r.is_tensor and not finite(r.obj)]
        weights = [] if first_seen else _nonfinite_weights(name, rows)
        if not bad and not weights:
            continue
        found = {"name": name, "outputs": bad, "stack": dump.stacks.get(name, []), "parents": dump.parent_chain(name)}
        if weights:  # a weight already NaN/Inf when the step starts: it came in here, with its first use
            found["reason"] = nonfinite.origin(dump, name, weights, dump.step, against_golden=False)[0]
            return found, found
        first_seen = first_seen or found
        if all(_finite_row(r) for r in _made_from(dump, name, rows)):
            return found, first_seen
    return None, first_seen


def _nonfinite_weights(name: str, rows) -> list:
    """A forward record's weights (a module's parameters, an API call's inputs that require grad) that hold
    NaN/Inf, as compare/nonfinite.py's entries. A buffer or an argument holding -inf (a causal mask) is none."""
    if split_name(name)[1] != "forward":
        return []
    found = []
    for r in rows:
        if r.role == INPUT and r.is_tensor and not finite(r.obj):
            suffix = r.name[len(name) + 1:]
            sort = nonfinite.kind(name, suffix, r.obj.get("requires_grad") is True)
            if sort != nonfinite.DATA:
                found.append((suffix, sort, r.obj))
    return found


def analyse(path: str, output_dir: str | None = None, quiet: bool = False) -> dict:
    result = {"ranks": []}
    try:
        dumps = resolve(path)
    except DumpError as exc:  # an overflow_check run writes a step's folder only when the step overflowed
        if os.path.isdir(path) or (not os.path.lexists(path) and os.path.isdir(os.path.dirname(os.path.abspath(path)))):
            raise DumpError(f"{exc} (a dump of task overflow_check has a step folder only for a step that "
                            f"overflowed: none there means no call made NaN/Inf)") from None
        raise
    output_dir = output_dir or "."
    output_folder(output_dir)  # before the analysis: a bad -o is said at once
    for step, rank, dump_json in dumps:
        found, seen = first_overflow(load_dump(dump_json, step, rank))
        result["ranks"].append({"step": step, "rank": rank, "dump": dump_json, "first_overflow": found,
                                "first_nonfinite": seen})
        if not quiet:
            where = place(step, rank)  # `step 0`, not `step 0 rank None`, for a single-process run
            if found and found.get("reason"):
                line = f"[{where}] first overflow: {found['name']} -- {found['reason']}{at(found)}"
            elif found:
                line = f"[{where}] first overflow: {found['name']} ({', '.join(found['outputs'])}){at(found)}"
            elif seen:
                line = (f"[{where}] no call turns finite inputs into NaN/Inf; NaN/Inf first seen in the outputs of "
                        f"{seen['name']}{at(seen)}, which got them with its inputs or arguments: made by code that "
                        f"is not recorded (at L0, between modules) or given as an argument (a -inf mask)")
            else:
                line = f"[{where}] no call turns finite inputs into NaN/Inf"
            console.say(console.wrapped(line))
    try:
        write_atomic(os.path.join(output_dir, "overflow_summary.json"), json.dumps(result, indent=1))
    except OSError as exc:
        raise unwritable(exc, output_dir) from None
    return result
