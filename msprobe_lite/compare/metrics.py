"""Measures between a target value and a golden value: small pure functions, no framework imports.

Statistics mode measures the four statistics; tensor mode measures the tensors themselves (accumulated in
float64, in chunks, so memory stays a small multiple of the largest tensor). `row_error` is the one number
the judge uses: the difference relative to the tensor's magnitude, which stays meaningful for tensors whose
mean is near zero (where a plain relative error of the mean explodes).
"""
from __future__ import annotations

import functools
import math

from .dtypes import bare

STATS = ("Max", "Min", "Mean", "Norm")
# machine epsilon by dtype name, torch's and MindSpore's spellings alike
_EPS = {"float64": 2.220446049250313e-16, "float32": 1.1920928955078125e-07, "float16": 9.765625e-04,
        "bfloat16": 7.8125e-03}
CHUNK = 1 << 20


@functools.lru_cache(maxsize=256)
def eps_of(dtype: str) -> float:
    """Machine epsilon of a float dtype name (`torch.bfloat16`, `BFloat16`, `float32`); 0 for exact types."""
    return _EPS.get(bare(dtype), 0.0)


def _num(v):
    """v if it is a number (not a bool), else None. JSON gives exact ints and floats: checked first, cheaply."""
    cls = v.__class__
    if cls is float or cls is int:
        return v
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def diff(t, g):
    t, g = _num(t), _num(g)
    if t is None or g is None:
        return None
    if t == g or (t != t and g != g):
        return 0.0
    return t - g


def relative(t, g):
    """|t - g| / |g|: 0 when equal (both NaN included), inf when g is 0 and t is not."""
    return _relative_of(diff(t, g), g)


def _relative_of(d, g):
    """relative() from an already computed diff(t, g)."""
    if d is None:
        return None
    if d == 0:
        return 0.0
    if d != d:
        return math.inf
    return abs(d) / abs(g) if g != 0 else math.inf


def numel(shape) -> int:
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


def finite(obj: dict) -> bool:
    """False when the object's Max or Min is NaN or an infinity (what the statistics say of its values)."""
    for v in (obj.get("Max"), obj.get("Min")):
        if v.__class__ is float:
            if v - v != 0:      # NaN and infinities only
                return False
        elif v is not None and not isinstance(v, bool) and isinstance(v, (int, float)) and not math.isfinite(v):
            return False
    return True


def stat_error(t: dict, g: dict) -> float:
    """The largest of: the Max, Min and Mean differences relative to the golden tensor's magnitude (its
    largest |value|, or its RMS, whichever is larger), and the Norm's difference relative to the golden Norm
    (NormRelativeErr; a Norm difference grows with the tensor's size, so it is not set against one value's
    magnitude). 0 for identical statistics."""
    return stat_measures(t, g)[2]


def magnitude(g: dict) -> float:
    """A tensor's magnitude from its statistics: its largest absolute value or its RMS, finite ones only
    (masked attention scores hold -inf, and against an infinite scale every difference of their finite
    statistics would vanish: softmax would seem to get equal inputs)."""
    gmax, gmin, gnorm = _num(g.get("Max")) or 0.0, _num(g.get("Min")) or 0.0, _num(g.get("Norm")) or 0.0
    return max((abs(v) for v in (gmax, gmin, gnorm / math.sqrt(max(numel(g.get("shape")), 1)))
                if math.isfinite(v)), default=0.0)


def noise_error(t: dict, g: dict, reference: float) -> float:
    """The largest difference of Max, Min and Mean against `reference`, the magnitude of what a noise-sized
    value was computed from (see Judge: a value below its inputs' rounding)."""
    diffs = [diff(t.get(k), g.get(k)) for k in STATS[:3]]
    present = [abs(d) for d in diffs if d is not None]
    if any(d != d for d in present):
        return math.inf
    return max(present, default=0.0) / reference


def stat_measures(t: dict, g: dict) -> tuple:
    """([X diff], [XRelativeErr], stat_error) for the four statistics, in one pass: statistics mode calls this
    for every row of a dump, so the differences are computed once, not once per column and again for the
    error, and diff() is inlined for plain numbers (equal statistics, the usual case, cost least)."""
    diffs, rels = [], []
    for k in STATS:
        tv, gv = t.get(k), g.get(k)
        if (tv.__class__ is float or tv.__class__ is int) and (gv.__class__ is float or gv.__class__ is int):
            if tv == gv or (tv != tv and gv != gv):
                diffs.append(0.0)
                rels.append(0.0)
                continue
            d = tv - gv
        else:
            d = diff(tv, gv)
        diffs.append(d)
        rels.append(_relative_of(d, gv))
    present = [abs(d) for d in diffs if d is not None]
    if not present:
        return diffs, rels, 0.0
    if any(d != d for d in present):  # NaN: max() would pass over one that is not first
        return diffs, rels, math.inf
    worst = max(present)
    if worst == 0:
        return diffs, rels, 0.0
    if worst == math.inf:
        return diffs, rels, math.inf
    scale = magnitude(g)
    values = max([abs(d) for d in diffs[:3] if d is not None], default=0.0)
    error = values / scale if scale > 0 else (math.inf if values else 0.0)
    if rels[3]:  # the Norm relative to itself: NormRelativeErr
        error = max(error, rels[3])
    return diffs, rels, error


def _is_numpy(x) -> bool:
    return type(x).__module__ == "numpy" or not hasattr(x, "numpy")


def _flat(x):
    """x as one dimension, without a copy: a numpy array, or a torch tensor numpy cannot hold (bf16)."""
    if _is_numpy(x):
        import numpy as np
        return np.asarray(x).reshape(-1)
    return x.reshape(-1)


def _float64(part):
    """A chunk as a float64 numpy array (torch converts its own chunks: numpy has no bf16)."""
    if _is_numpy(part):
        import numpy as np
        return np.asarray(part, dtype=np.float64)
    return part.double().numpy()


def tensor_metrics(t, g, eps: float) -> dict:
    """Cosine, EucDist, MaxAbsErr, MaxRelativeErr and the error ratios of two equal-shape arrays, in
    one chunked float64 pass. Positions where both hold the same non-finite value count as equal; a
    non-finite value on one side only is reported as `nonfinite`."""
    import numpy as np

    t, g = _flat(t), _flat(g)
    n = len(t)
    dot = tt = gg = sq = 0.0
    max_abs = max_rel = 0.0
    within1 = within5 = 0
    mismatched_nonfinite = 0
    floor = eps if eps > 0 else np.finfo(np.float64).tiny
    with np.errstate(all="ignore"):
        for start in range(0, n, CHUNK):
            a = _float64(t[start:start + CHUNK])
            b = _float64(g[start:start + CHUNK])
            same_nonfinite = ~np.isfinite(a) & ~np.isfinite(b) & ((a == b) | (np.isnan(a) & np.isnan(b)))
            bad = (~np.isfinite(a) | ~np.isfinite(b)) & ~same_nonfinite
            mismatched_nonfinite += int(bad.sum())
            ok = np.isfinite(a) & np.isfinite(b)
            a, b = a[ok], b[ok]
            d = np.abs(a - b)
            rel = d / np.where(b == 0, floor, np.abs(b))
            dot += float(a @ b)
            tt += float(a @ a)
            gg += float(b @ b)
            sq += float(d @ d)
            if d.size:
                max_abs = max(max_abs, float(d.max()))
                max_rel = max(max_rel, float(rel.max()))
            within1 += int((rel < 0.001).sum()) + int(same_nonfinite.sum())
            within5 += int((rel < 0.005).sum()) + int(same_nonfinite.sum())
    if tt == 0 and gg == 0:
        cosine, note = 1.0, ""
    elif tt == 0 or gg == 0:
        cosine, note = math.nan, "one side is all zeros: cosine undefined"
    else:
        cosine, note = dot / math.sqrt(tt * gg), ""
    if n == 1 and sq > 0:  # said only where it matters: equal single values (a loss) are no warning
        note = "size-1 tensor: cosine not meaningful"
    return {"Cosine": cosine, "EucDist": math.sqrt(sq), "MaxAbsErr": max_abs, "MaxRelativeErr": max_rel,
            "One Thousandth Err Ratio": within1 / n if n else 1.0,
            "Five Thousandths Err Ratio": within5 / n if n else 1.0,
            "rel_l2": math.sqrt(sq) / math.sqrt(gg) if gg > 0 else (0.0 if sq == 0 else math.inf),
            "nonfinite": mismatched_nonfinite, "note": note}
