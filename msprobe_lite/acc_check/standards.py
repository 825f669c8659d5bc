"""What a dtype's rounding explains: the per-dtype standard that acc_check judges a call's output against.

Errors are counted in ULPs of the output's dtype (the spacing of representable numbers at a value): a kernel
that computes exactly and rounds once is at most 0.5 ULP from the float64 replay. Kernels that accumulate
(matmul, reductions, normalisations) add rounding of their partial results, which scales with the size of
the terms rather than of the result, so an element is measured against max(|reference|, the tensor's RMS):
cancellation at an element near zero is not read as lost precision (the small-value rule).

The numbers are docs/acc_check.md's table, chosen here: 16-bit types are computed in float32 and rounded once
by every PyTorch CPU kernel (a few ULPs cover chains of two or three roundings); float32 kernels accumulate in
float32, whose error grows like sqrt(K) ULPs over K terms, so their bounds are wider. A relative error of 2e-4
is 1,678 to 3,355 ULPs of float32, an fp16 computation inside a float32 call about 4,096: both are errors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..compare.dtypes import bare


@dataclass(frozen=True)
class Standard:
    dtype: str          # without the framework's prefix: float32, bfloat16, float16, float64
    mantissa: int       # explicit mantissa bits: one ULP at 1.0 is 2 ** -mantissa
    min_exponent: int   # exponent of the smallest normal number: ULPs below it are the subnormal spacing
    max_exponent: int   # exponent of the largest finite number: a value past it rounds to infinity
    pass_ulp: float     # at most this many ULPs: what rounding in the dtype explains
    error_ulp: float    # more than this many: precision lost beyond the dtype (between the two: warning)

    @property
    def eps(self) -> float:
        return math.ldexp(1.0, -self.mantissa)

    @property
    def overflow(self) -> float:
        """The smallest magnitude that rounds to infinity in this dtype (the largest finite number plus half
        its ULP)."""
        return math.ldexp(2.0 - math.ldexp(1.0, -self.mantissa - 1), self.max_exponent)


STANDARDS = {s.dtype: s for s in (
    Standard("float16", 10, -14, 15, pass_ulp=4.0, error_ulp=16.0),
    Standard("bfloat16", 7, -126, 127, pass_ulp=4.0, error_ulp=16.0),
    Standard("float32", 23, -126, 127, pass_ulp=64.0, error_ulp=512.0),
    Standard("float64", 52, -1022, 1023, pass_ulp=64.0, error_ulp=512.0),
)}
# An error balance (the mean signed error over the mean error, signed by each reference's sign: +1 when every
# element is too large in magnitude) this far from zero, over this many elements with an error, is a bias that
# rounding to nearest does not make (truncation, a scale off): a warning, since a bias within the ULP bounds
# above moves no result much on its own.
BALANCE_LIMIT = 0.5
BALANCE_MIN_ELEMENTS = 256
BALANCE_MIN_MEAN_ULP = 0.5
# The replay runs a second time with every floating input multiplied by 1 +- NUDGE (one float32 rounding, the
# precision PyTorch's kernels compute 16- and 32-bit types in): how far the result moves is its sensitivity
NUDGE = 2.0 ** -24
# Integer and bool outputs must equal the replay's; a few flipped elements (a comparison of values within a
# rounding of each other, an argmax between near-ties) is a warning, more than this fraction an error.
FLIPPED_ERROR_FRACTION = 0.01


def standard_of(dtype: str):
    """The Standard of a float dtype, or None (integer, bool, complex and 8-bit floats are not measured in
    ULPs)."""
    return STANDARDS.get(bare(dtype))
