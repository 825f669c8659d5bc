"""How far a recorded output is from its float64 replay: absolute, relative and ULP errors, error balance.

Framework-neutral: both sides come as numpy float64 arrays of the same shape (the recorded values exactly, the
replay's unrounded), with the Standard of the dtype the output was recorded in.
"""
from __future__ import annotations

import numpy as np

from .standards import Standard


def _ulps(reference: np.ndarray, standard: Standard) -> np.ndarray:
    """The ULP of `standard`'s dtype at each |reference|: 2 ** (exponent - mantissa), the subnormal spacing
    below the smallest normal number."""
    _, exponent = np.frexp(reference)  # |x| = m * 2 ** e with 0.5 <= m < 1: the binade's exponent is e - 1
    return np.ldexp(1.0, np.maximum(exponent - 1, standard.min_exponent) - standard.mantissa)


def _rounded_nonfinite(reference: np.ndarray, standard: Standard) -> np.ndarray:
    """The reference's non-finite values as the dtype holds them: a finite float64 value past the dtype's
    range is infinity there (what a correct kernel returns)."""
    return np.where(np.abs(reference) >= standard.overflow, np.copysign(np.inf, reference), reference)


def measure_float(recorded: np.ndarray, reference: np.ndarray, standard: Standard, sensitivity=None) -> dict:
    """Measures of a float output: `elements`; `nonfinite_mismatch` (elements where one side is NaN/Inf and the
    other is not the same); over the finite elements `max_abs_err`, `max_rel_err`, `norm_rel_err`
    (||recorded - reference|| / ||reference||), `max_ulp`, `mean_ulp`, `worst_index` (flat index of the largest
    ULP error) and `balance`.

    An element's ULP is the dtype's at max(|reference|, the reference's RMS), or, where larger, the element's
    `sensitivity` or the RMS of all elements' sensitivity: how far the exact result moves when the inputs are
    rounded once (replay.py nudges them; one random nudge may happen to cancel at an element). A
    result that cancels (a sum of terms much larger than itself) is as uncertain as its terms' rounding makes
    it, whatever its own size."""
    y = np.asarray(recorded, dtype=np.float64).reshape(-1)
    r = np.asarray(reference, dtype=np.float64).reshape(-1)
    s = None if sensitivity is None else np.asarray(sensitivity, dtype=np.float64).reshape(-1)
    r_dtype = _rounded_nonfinite(r, standard)
    finite = np.isfinite(y) & np.isfinite(r_dtype)
    same_nonfinite = (np.isnan(y) & np.isnan(r_dtype)) | (np.isinf(y) & (y == r_dtype))
    out = {"elements": int(y.size), "nonfinite_mismatch": int((~finite & ~same_nonfinite).sum())}
    y, r = y[finite], r[finite]
    if s is not None and s.size == finite.size:
        s = np.nan_to_num(s[finite], nan=0.0, posinf=0.0)
    else:
        s = None
    if not y.size:
        out.update(max_abs_err=0.0, max_rel_err=0.0, norm_rel_err=0.0, max_ulp=0.0, mean_ulp=0.0,
                   worst_index=None, balance=0.0)
        return out
    diff = y - r
    abs_err = np.abs(diff)
    magnitude = np.abs(r)
    rms = float(np.sqrt(np.mean(magnitude * magnitude)))
    unit = _ulps(np.maximum(magnitude, rms), standard)
    if s is not None:  # an element's own sensitivity, or the tensor's typical one: a single nudge may cancel
        unit = np.maximum(unit, np.maximum(s, float(np.sqrt(np.mean(s * s)))))
    ulp_err = abs_err / unit
    nonzero = magnitude > 0
    norm = float(np.linalg.norm(r))
    worst = int(np.argmax(ulp_err))
    out.update(max_abs_err=float(abs_err.max()),
               max_rel_err=float((abs_err[nonzero] / magnitude[nonzero]).max()) if nonzero.any() else 0.0,
               norm_rel_err=float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff)),
               max_ulp=float(ulp_err[worst]), mean_ulp=float(ulp_err.mean()),
               worst_index=int(np.flatnonzero(finite)[worst]), balance=_balance(diff, r))
    out["elements_with_error"] = int((abs_err > 0).sum())
    return out


def _balance(diff: np.ndarray, reference: np.ndarray) -> float:
    """mean(sign(reference) * error) / mean(|error|), in [-1, 1]: about 0 for rounding to nearest, +1 when
    every element is too large in magnitude, -1 when every one is too small (truncation)."""
    total = float(np.abs(diff).sum())
    return float((np.sign(reference) * diff).sum()) / total if total > 0 else 0.0


def measure_exact(recorded: np.ndarray, reference: np.ndarray) -> dict:
    """Measures of an integer or bool output: `elements` and `mismatched` (elements that differ)."""
    y, r = np.asarray(recorded).reshape(-1), np.asarray(reference).reshape(-1)
    return {"elements": int(y.size), "mismatched": int((y != r).sum())}
