"""Where NaN/Inf first comes into a step (issue 32).

The first call whose output holds NaN/Inf where the golden's is finite is not always where it came from: a
weight (or buffer) that is already NaN when the step starts makes every call after its first use non-finite,
down to the loss's backward, whose own inputs (the incoming gradient) are finite. So the step's first tensor
that is non-finite only in the target decides: an input of a forward call that no earlier call's output
explains is the origin, named with its first use; every later non-finite value follows from it.
"""
from __future__ import annotations

from .metrics import finite
from .pair import is_module, split_name

PARAMETER = "parameter"  # a module's parameter row (L0, mix)
WEIGHT = "weight"        # an API call's input that requires grad (L1, mix): a weight as far as statistics tell
DATA = "data"            # any other input: the input data, a buffer, or (a module's input) an activation


def kind(call: str, suffix: str, requires_grad: bool) -> str:
    if suffix.startswith("parameters."):
        return PARAMETER
    return WEIGHT if requires_grad and not is_module(call) else DATA


def what(obj: dict) -> str:
    values = [obj.get(k) for k in ("Max", "Min", "Mean", "Norm")]
    return "NaN" if any(isinstance(v, float) and v != v for v in values) else "Inf"


def origin(dump, call: str, entries: list, step, against_golden: bool = True) -> tuple:
    """(reason, from_a_weight) for forward call `call` of `dump`, the first to take a value that is NaN/Inf
    (`entries`: (suffix, kind, statistics)) when no earlier call made one: only in the target (`against_golden`), or
    at all (overflow_check, weights only)."""
    at = f"the start of step {step}" if step is not None else "the start of the step"
    if against_golden:
        at += " (the golden's is finite)"
    for suffix, sort, obj in entries:
        if sort == PARAMETER:
            owner = split_name(call)[0]
            return (f"the {suffix.split('.', 1)[1]} of {owner} is {what(obj)} at {at}: "
                    f"it was loaded, initialised or updated so before this step, and this call is its first use",
                    True)
    for suffix, sort, obj in entries:
        if sort == WEIGHT:
            named = _parameter_of_parent(dump, call, obj)
            which = f"the {named[1]} of {named[0]}" if named else f"its {suffix}, which requires grad as a weight does,"
            return (f"{which} is {what(obj)} at {at} and no earlier call made it: a weight "
                    f"loaded, initialised or updated so before this step; this call is its first use", True)
    suffix, _, obj = entries[0]
    return (f"its {suffix} is {what(obj)} where the golden's is finite, and no earlier call made it: the input data "
            f"(or a buffer, or code before the first record) already held it", False)


def _parameter_of_parent(dump, call: str, obj: dict):
    """(module, parameter name) of the innermost module around `call` (mix) with a parameter of the same shape
    that is non-finite too, or None."""
    for parent in dump.parent_chain(call):
        if not is_module(parent):
            continue
        params = (dump.records.get(parent) or {}).get("parameters") or {}
        for name, value in params.items():
            if isinstance(value, dict) and value.get("shape") == obj.get("shape") and what(value) == what(obj) \
                    and not finite(value):
                return split_name(parent)[0], name
        return None
    return None

