"""Statistics rules shared by every adapter, and the numpy implementation of them.

The rules (spec, "Tensor object"): empty -> all null; bool -> Max = any, Min = all, Mean/Norm null; 0-d ->
Max = Min = Mean = value, Norm = |value| (an L2 norm is never negative); integers -> exact Max/Min, Mean and
Norm in float64; low-precision floats accumulate in float32; NaN and infinities are kept.

Floating-point values of every common dtype go through `one_pass` first: a C kernel (`_fast_stats.c`) that
computes the four statistics in a single pass, several times faster than a numpy or torch call per statistic.
It is built when the package is installed with a C compiler; without one, `one_pass` is None and the same
rules run on numpy and torch. It answers None for NaN, infinities and float32 sums that overflow: the library
routes below then decide, so the spec's rules for those live in one place.
"""
from __future__ import annotations

import math

import numpy as np

from .records import NO_STATS
from . import native

try:
    native.require("_fast_stats")
    from ._fast_stats import stats as one_pass
except ImportError:  # built without a C compiler: the library routes alone
    one_pass = None

# the kernel's kinds; a kind's code for C callers (_fast_stats.h) is its index here
KERNEL_KINDS = ("float32", "float64", "bfloat16")


def one_pass_numpy(array):
    """(Max, Min, Mean, Norm) of a non-empty float32/float64/bfloat16 numpy array in one pass, or None when
    the kernel is not built, the dtype is another, or the values are not all finite. The kernel reads raw
    native items: other byte orders are numpy's."""
    kind = array.dtype.name  # numpy's names are the kernel's (ml_dtypes' bfloat16, MindSpore's: raw 2-byte items)
    if one_pass is None or kind not in KERNEL_KINDS or not array.dtype.isnative:
        return None
    flat = array.ravel()  # a view when contiguous, else a contiguous copy (reshape could keep strides)
    return one_pass(flat.view("uint16") if kind == "bfloat16" else flat, kind)


# Where summing squares in float32 (or float64) keeps every digit: beyond, the squares overflow or go
# subnormal. The kernel uses the same lower bounds in C and sees an overflow itself (its squares are Inf).
FLOAT32_SQUARES = (1e-17, 1e18)
FLOAT64_SQUARES = (1e-150, 1e150)


def scaled_norm(values, largest: float) -> float:
    """L2 norm of finite numpy values whose largest magnitude is `largest` (> 0), each divided by it first,
    in float64: exact where plain squares overflow (float64 past 1e154) or underflow (float32 gradients
    around 1e-20)."""
    scaled = values.astype(np.float64) / largest
    return largest * math.sqrt(float(np.dot(scaled, scaled)))


def norm_in_range(largest: float, bounds: tuple) -> bool:
    return largest == 0.0 or bounds[0] <= largest <= bounds[1]


def numpy_stats(array) -> tuple:
    if isinstance(array, np.ma.MaskedArray):  # masked values are not values
        array = array.compressed()
    if array.size == 0:
        return NO_STATS
    fast = one_pass_numpy(array)
    if fast is not None:
        return fast
    if array.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 has no numpy arithmetic: float32 accumulates
        array = array.astype(np.float32)
    if array.dtype == np.bool_:
        return bool(array.any()), bool(array.all()), None, None
    if np.issubdtype(array.dtype, np.complexfloating):
        return None, None, None, float(np.linalg.norm(array.ravel()))
    if np.issubdtype(array.dtype, np.integer):
        wide = array.astype(np.float64)
        return int(array.max()), int(array.min()), float(wide.mean()), float(np.linalg.norm(wide.ravel()))
    if not np.issubdtype(array.dtype, np.number):
        return NO_STATS
    acc = array.astype(np.float64 if array.dtype == np.float64 else np.float32, copy=False).ravel()
    high, low = float(acc.max()), float(acc.min())
    largest = max(abs(high), abs(low))
    norm = float(np.linalg.norm(acc))
    if math.isfinite(largest) and not norm_in_range(
            largest, FLOAT64_SQUARES if acc.dtype == np.float64 else FLOAT32_SQUARES):
        norm = scaled_norm(acc, largest)
    return high, low, float(acc.mean(dtype=acc.dtype)), norm
