"""Statistics rules shared by every adapter, and the numpy implementation of them.

The rules (spec, "Tensor object"): empty -> all null; bool -> Max = any, Min = all, Mean/Norm null; 0-d ->
Max = Min = Mean = value, Norm = |value| (an L2 norm is never negative); integers -> exact Max/Min, Mean and
Norm in float64; low-precision floats accumulate in float32; NaN and infinities are kept.
"""
from __future__ import annotations

from .records import NO_STATS


def numpy_stats(array) -> tuple:
    import numpy as np

    if array.size == 0:
        return NO_STATS
    if array.dtype == np.bool_:
        return bool(array.any()), bool(array.all()), None, None
    if np.issubdtype(array.dtype, np.complexfloating):
        return None, None, None, float(np.linalg.norm(array.ravel()))
    if np.issubdtype(array.dtype, np.integer):
        wide = array.astype(np.float64)
        return int(array.max()), int(array.min()), float(wide.mean()), float(np.linalg.norm(wide.ravel()))
    if not np.issubdtype(array.dtype, np.number):
        return NO_STATS
    acc = array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False)
    return (float(acc.max()), float(acc.min()), float(acc.mean(dtype=acc.dtype)),
            float(np.linalg.norm(acc.ravel())))
