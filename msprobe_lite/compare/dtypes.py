"""The dtype names a dump's tensor objects may carry: PyTorch's, MindSpore's and numpy's.

A tensor object whose dtype is none of them (`torch.float99`) is off-format: judged, it read as an exact
type of its own (no machine epsilon, no float kind), so its call could pass or err on a name. Known names
are remembered as they are seen, so the check costs one set lookup per tensor of a large dump.
"""
from __future__ import annotations

# spelled without the framework's prefix, in lower case (`torch.float32`, `Float32`, `mindspore.float32`)
_NAMES = frozenset((
    # PyTorch
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "bfloat16",
    "float32", "float64", "complex32", "complex64", "complex128", "qint8", "quint8", "qint32", "quint4x2",
    "quint2x4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16", "int1", "int2", "int3", "int4",
    "int5", "int6", "int7", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
    "half", "float", "double", "long", "int", "short", "cfloat", "cdouble",
    # MindSpore (Float32, BFloat16, Float8E4M3FN, HiFloat8, Int4, UInt8, String, ...)
    "float8e4m3fn", "float8e5m2", "hifloat8", "uint", "number", "string",
    # numpy's names beyond those (ml_dtypes' bfloat16 is above)
    "float128", "complex256", "longdouble", "clongdouble", "object", "str", "bytes", "void",
    "none",  # a dtype that could not be read when the tensor was dumped (written as null)
))
KNOWN: set = set()   # exact spellings already accepted (rows.Row looks here first)
_ALIASES = {"half": "float16", "float": "float32", "double": "float64"}  # PyTorch's other names of float types


def bare(dtype) -> str:
    """A dtype's name in lower case without its framework's prefix: `torch.float32`, `Float32`,
    `mindspore.float32`, `numpy.float32` -> `float32`; PyTorch's `half`, `float`, `double` as float16/32/64."""
    key = str(dtype).lower()
    for prefix in ("torch.", "mindspore.", "numpy."):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return _ALIASES.get(key, key)


def known_dtype(dtype: str, kind=None) -> bool:
    """Whether `dtype` (a tensor object's dtype, as text) names a dtype. `kind`: the object's type; a numpy
    array's dtype may be any that numpy reads (`<U5`, `datetime64[ns]`)."""
    if dtype in KNOWN:
        return True
    ok = bare(dtype) in _NAMES or (kind == "numpy.ndarray" and _numpy_reads(dtype))
    if ok and len(KNOWN) < 4096:
        KNOWN.add(dtype)
    return ok


def _numpy_reads(dtype: str) -> bool:
    try:
        import numpy as np
        np.dtype(dtype)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError, SyntaxError for odd texts
        return False
    return True


# torch.finfo / numpy.finfo of the float dtypes a run computes in: (min, max, eps, tiny)
_CONSTANTS = {
    "float16": (-65504.0, 65504.0, 0.0009765625, 6.103515625e-05),
    "bfloat16": (-3.3895313892515355e+38, 3.3895313892515355e+38, 0.0078125, 1.1754943508222875e-38),
    "float32": (-3.4028234663852886e+38, 3.4028234663852886e+38, 1.1920928955078125e-07, 1.1754943508222875e-38),
    "float64": (-1.7976931348623157e+308, 1.7976931348623157e+308, 2.220446049250313e-16, 2.2250738585072014e-308),
}


def _constant_of(value, dtypes) -> int | None:
    """Which of (min, max, eps, tiny) `value` is for one of the float `dtypes`, or None."""
    if value.__class__ is not float:
        return None
    for dtype in dtypes:
        for which, constant in enumerate(_CONSTANTS.get(dtype, ())):
            if abs(value - constant) <= 1e-6 * abs(constant):  # written through float32 or not
                return which
    return None


def same_dtype_constant(a, b, a_dtypes, b_dtypes) -> bool:
    """Whether two scalar arguments are the same constant of each run's own dtypes (`a_dtypes`, `b_dtypes`:
    those of the call's tensors, lower case without prefix): `torch.finfo(x.dtype).min` is -3.39e38 under
    bf16 and -3.40e38 in fp32, the same argument of a mask (T5's)."""
    which = _constant_of(a, a_dtypes)
    return which is not None and which == _constant_of(b, b_dtypes)
