"""Records that two tools write under one name for different quantities (issue 32; docs/format.md lists them).

`Functional.cross_entropy.N.backward`: msprobe_lite records the gradient of the logits (softmax minus the
one-hot target, over the batch: positive and negative values); the reference tool (mindstudio-probe) hooks the
autograd node of cross_entropy's last step, nll_loss, and records the gradient of log_softmax's output (minus
one over the batch at each target, zero elsewhere: never positive). Compared, they differ by design, so such a
pair is "not comparable", told apart by that sign, never a divergence.
"""
from __future__ import annotations

NOT_COMPARABLE = "not comparable (different quantities)"

# API (its backward record) -> what each tool records under its name
_KNOWN = {
    "Functional.cross_entropy": "the reference tool records the gradient of its inner nll_loss (of log_softmax's "
                                "output), msprobe_lite the gradient of the logits",
}


def _never_positive(obj) -> bool:
    high = obj.get("Max") if isinstance(obj, dict) else None
    return isinstance(high, (int, float)) and not isinstance(high, bool) and high <= 0


def not_comparable(base: str, direction: str, t_record: dict, g_record: dict) -> str | None:
    """The reason a pair of records is not comparable, or None."""
    what = _KNOWN.get(base)
    if what is None or direction != "backward":
        return None
    t_out, g_out = (r.get("output") if isinstance(r, dict) else None for r in (t_record, g_record))
    if not t_out or not g_out or not isinstance(t_out, list) or not isinstance(g_out, list):
        return None
    if _never_positive(t_out[0]) != _never_positive(g_out[0]):
        return f"{NOT_COMPARABLE}: {what}"
    return None


def may_differ(base: str, direction: str) -> bool:
    """Whether a record may be one of those (its verdict then needs both records whole)."""
    return direction == "backward" and base in _KNOWN
