"""The verdict of one replayed call: pass, warning or error, from the measures of each of its outputs."""
from __future__ import annotations

from dataclasses import dataclass

from . import standards
from .measure import measure_exact, measure_float

PASS, WARNING, ERROR, SKIPPED = "pass", "warning", "error", "skipped"
_RANK = {PASS: 0, WARNING: 1, ERROR: 2}


class NotReplayable(Exception):
    """A call that a replayer cannot run again, with the reason (the call is listed as skipped)."""


@dataclass
class Output:
    """One output tensor of a call beside its replay: `label` (`output.0`, `output.1.0`), the dtype it was
    recorded in, both as numpy arrays (float64 for float dtypes); `sensitivity` (or None) as measure_float
    takes it."""
    label: str
    dtype: str
    recorded: object
    reference: object
    is_float: bool
    sensitivity: object = None  # per element, how far the reference moves when its inputs are rounded once
    left_out: str = ""          # why this output is not judged (the rest of the call is)


def judge_output(out: Output) -> tuple:
    """(verdict, reason, measures) of one output."""
    if out.left_out:
        return SKIPPED, f"{out.label} not judged: {out.left_out}", {"output": out.label, "dtype": out.dtype}
    if not out.is_float:
        m = measure_exact(out.recorded, out.reference)
        m.update(output=out.label, dtype=out.dtype)
        if not m["mismatched"]:
            return PASS, f"{out.label} ({out.dtype}) equals the replay", m
        share = m["mismatched"] / max(m["elements"], 1)
        verdict = ERROR if share > standards.FLIPPED_ERROR_FRACTION else WARNING
        return verdict, (f"{out.label} ({out.dtype}): {m['mismatched']} of {m['elements']} elements differ from "
                         f"the float64 replay"), m
    std = standards.standard_of(out.dtype)
    if std is None:
        return SKIPPED, f"{out.label}: dtype {out.dtype} has no precision standard here (float16, bfloat16, " \
                        f"float32, float64)", {"output": out.label, "dtype": out.dtype}
    m = measure_float(out.recorded, out.reference, std, out.sensitivity)
    m.update(output=out.label, dtype=std.dtype)
    if m["nonfinite_mismatch"]:
        return ERROR, (f"{out.label}: {m['nonfinite_mismatch']} of {m['elements']} elements are NaN/Inf where the "
                       f"float64 replay (rounded to {std.dtype}) is finite, or the reverse"), m
    how_far = (f"{out.label} is {m['max_ulp']:.3g} ULPs of {std.dtype} from the float64 replay (max relative error "
               f"{m['max_rel_err']:.3g}, norm {m['norm_rel_err']:.3g})")
    if m["max_ulp"] > std.error_ulp:
        return ERROR, f"{how_far}: more than the {std.error_ulp:g} that rounding in {std.dtype} explains", m
    if m["max_ulp"] > std.pass_ulp:
        return WARNING, f"{how_far}: more than one rounding ({std.pass_ulp:g}), within {std.error_ulp:g}", m
    if abs(m["balance"]) > standards.BALANCE_LIMIT and m.get("elements_with_error", 0) >= \
            standards.BALANCE_MIN_ELEMENTS and m["mean_ulp"] >= standards.BALANCE_MIN_MEAN_ULP:
        side = "too large" if m["balance"] > 0 else "too small"
        return WARNING, (f"{out.label}: errors are biased (balance {m['balance']:+.2f}: mostly {side} in magnitude), "
                         f"within {std.pass_ulp:g} ULPs"), m
    return PASS, f"{out.label} within {m['max_ulp']:.3g} ULPs of {std.dtype} (rounding allows {std.pass_ulp:g})", m


def judge_call(outputs: list) -> tuple:
    """(verdict, reason, error) of a call from its outputs: the worst output's verdict, reason and measures.
    A call whose outputs all have no standard is skipped."""
    judged = [judge_output(o) for o in outputs]
    measured = [j for j in judged if j[0] != SKIPPED]
    if not measured:
        return SKIPPED, "; ".join(j[1] for j in judged) or "no tensor output to measure", {}
    worst = max(measured, key=lambda j: (_RANK[j[0]], j[2].get("max_ulp", 0.0), j[2].get("mismatched", 0)))
    unjudged = [j[1] for j in judged if j[0] == SKIPPED]  # said, so that a pass does not claim them
    return worst[0], "; ".join([worst[1], *unjudged]), worst[2]
