"""Tensor summaries for PyTorch: statistics computed once per tensor value, without waiting for the device.

A tensor that is the output of one call and the input of the next is summarised once: summaries are cached
by (object identity, version counter) for the step, and an in-place change bumps the version, so the cache
never returns stale numbers. On CPU the four statistics come back in one `tolist()`; on an accelerator they
stay a small device tensor (`Pending`) until the step is written, then all of them are fetched in one batch.
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch

from ..core.records import NO_STATS, Pending, TensorSummary
from ..core.values import ValueEncoder

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_NUMPY_NATIVE = {torch.float32, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                 torch.bool}
_NORM_SAFE = 1e18  # beyond this magnitude a float32 sum of squares could overflow: use float64 instead


_NUMPY_MAX = 1 << 16        # up to here numpy's reductions beat torch's per-op dispatch; above, torch's
_ONES = np.ones(_NUMPY_MAX, dtype=np.float32)  # multithreaded kernels win. sum = dot(a, 1): a BLAS pass


def _cpu_stats(t: torch.Tensor) -> tuple:
    """Statistics of a non-empty CPU tensor, by the fastest route for its size.

    Small tensors: numpy over a zero-copy view (one torch dispatch costs more than a numpy reduction there).
    Large ones: torch's fused kernels, stacked and fetched in one `tolist()`.
    """
    if t.numel() > _NUMPY_MAX and t.is_floating_point():
        return _large_float_stats(t)
    if t.dtype not in _NUMPY_NATIVE:
        if not t.is_floating_point():
            value, kind = _stat_tensor(t)
            return _as_stats(value.tolist(), kind)
        t = t.float()  # bf16/fp16/fp8: statistics accumulate in float32
    a = t.resolve_conj().resolve_neg().numpy().ravel()
    if a.dtype == np.bool_:
        return bool(a.any()), bool(a.all()), None, None
    if a.dtype.kind in "iu":
        wide = a.astype(np.float64)
        return int(a.max()), int(a.min()), float(wide.mean()), math.sqrt(float(np.dot(wide, wide)))
    high, low = float(a.max()), float(a.min())
    if not (math.isfinite(high) and math.isfinite(low)):
        with np.errstate(all="ignore"):  # NaN/Inf are data here, not a numpy warning for the user
            return high, low, float(a.mean(dtype=a.dtype)), math.sqrt(float(np.dot(a, a)))
    if a.dtype == np.float64 or max(abs(high), abs(low)) > _NORM_SAFE:
        a = a.astype(np.float64, copy=False)
        return high, low, float(a.mean()), math.sqrt(float(np.dot(a, a)))
    return high, low, float(np.dot(a, _ONES[:a.size])) / a.size, math.sqrt(float(np.dot(a, a)))


def _large_float_stats(t: torch.Tensor) -> tuple:
    """Large CPU floats: three multithreaded passes (aminmax, sum, dot) and one fetch; `vector_norm` would
    cost as much as the other three together. float32 squares overflow past ~1e19: then float64."""
    flat = (t.float() if t.dtype in _LOW_PRECISION or t.element_size() < 2 else t).reshape(-1)
    low, high = torch.aminmax(flat)
    high, low, total, squares = torch.stack((high, low, flat.sum(), torch.dot(flat, flat))).tolist()
    if math.isinf(squares) and math.isfinite(high) and math.isfinite(low):
        wide = flat.double()
        squares = torch.dot(wide, wide).item()
    return high, low, total / flat.numel(), math.sqrt(squares) if squares >= 0 else squares


def _stat_tensor(t: torch.Tensor):
    """(Max, Min, Mean, Norm) of a non-empty detached tensor as one small device tensor, and its kind."""
    if t.dtype == torch.bool:
        return torch.stack((t.any(), t.all())), "bool"
    if t.is_complex():
        return torch.linalg.vector_norm(t).reshape(1), "complex"
    if t.is_floating_point():
        acc = (t.float() if t.dtype in _LOW_PRECISION or t.element_size() < 2 else t).reshape(-1)
        low, high = torch.aminmax(acc)
        return torch.stack((high, low, acc.mean(), torch.linalg.vector_norm(acc))), "float"
    wide = t.double()
    low, high = torch.aminmax(t)
    return torch.stack((high.double(), low.double(), wide.mean(), torch.linalg.vector_norm(wide))), "int"


def _as_stats(values: list, kind: str) -> tuple:
    if kind == "bool":
        return bool(values[0]), bool(values[1]), None, None
    if kind == "complex":
        return None, None, None, values[0]
    if kind == "int":
        return int(values[0]), int(values[1]), values[2], values[3]
    return tuple(values)


class PendingStats(Pending):
    __slots__ = ("kind", "summary")

    def __init__(self, device_value, kind, summary):
        super().__init__(device_value)
        self.kind = kind
        self.summary = summary


def resolve_pending(pending: list) -> None:
    """Fetch every pending device statistic with one transfer per (device, dtype) and fill the summaries."""
    groups: dict = {}
    for p in pending:
        groups.setdefault((p.device_value.device, p.device_value.dtype), []).append(p)
    for items in groups.values():
        flat = torch.cat([p.device_value for p in items]).tolist()
        at = 0
        for p in items:
            size = p.device_value.numel()
            p.summary.stats = _as_stats(flat[at:at + size], p.kind)
            at += size
            p.device_value = None


def tensor_stats(t: torch.Tensor) -> tuple:
    """Statistics of a tensor, synchronously (used by tests and by CPU summaries)."""
    with torch._C.DisableTorchFunction():
        t = t.detach()
        if t.numel() == 0 or t.is_meta:
            return NO_STATS
        if t.device.type == "cpu":
            return _cpu_stats(t)
        value, kind = _stat_tensor(t)
        return _as_stats(value.tolist(), kind)


def _encode_size(v):
    return {"type": "torch.Size", "value": list(v)}


def _encode_dtype(v):
    return {"type": "torch.dtype", "value": str(v)}


def _encode_device(v):
    return {"type": "torch.device", "value": str(v)}


class TorchSummarizer:
    """Turns call arguments into encoded values with `TensorSummary` leaves, caching per tensor value."""

    def __init__(self, session):
        self.session = session
        self._cache: dict = {}
        self.encoder = ValueEncoder(
            lambda v: isinstance(v, torch.Tensor),
            {torch.Size: _encode_size, torch.dtype: _encode_dtype, torch.device: _encode_device}, torch.Tensor)

    def reset(self) -> None:
        self._cache.clear()

    def forget(self, tensors) -> None:
        """Drop cached summaries of tensors changed without a version bump (collectives write in place)."""
        for t in tensors:
            self._cache.pop(id(t), None)

    # Every entry point turns torch-function dispatch off: the debugger's own tensor work must neither be
    # recorded by the API capture nor pay its per-call overhead.
    def encode(self, value, path: tuple = ()):
        with torch._C.DisableTorchFunction():
            return self.encoder.encode(value, self._tensor_leaf, path)

    def encode_call(self, args, kwargs) -> tuple:
        """(input_args, input_kwargs) of a call, encoded in one pass."""
        with torch._C.DisableTorchFunction():
            return (self.encoder.encode(args, self._tensor_leaf, ("input_args",)),
                    self.encoder.encode(kwargs, self._tensor_leaf, ("input_kwargs",)))

    def encode_output(self, output) -> list:
        """`output` is always a list: a tuple/list result is encoded item by item, anything else is wrapped."""
        if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
            return self.encode(output, ("output",))
        return [self.encode(output, ("output", 0))]

    def summarize(self, t: torch.Tensor, fresh: bool = False) -> TensorSummary:
        """Summary of `t` now; `fresh` skips the cache (for buffers changed behind autograd's back)."""
        with torch._C.DisableTorchFunction():
            return self._cached(t, fresh)

    def _tensor_leaf(self, t, path):
        return self._cached(t)

    def _cached(self, t: torch.Tensor, fresh: bool = False) -> TensorSummary:
        key = id(t)
        cached = self._cache.get(key)
        version = t._version
        if not fresh and cached is not None and cached[0]() is t and cached[1] == version:
            return cached[2]
        summary = self._summarize(t)
        try:
            self._cache[key] = (weakref.ref(t), version, summary)
        except TypeError:  # tensor types that refuse weak references are simply not cached
            pass
        return summary

    def _summarize(self, t: torch.Tensor) -> TensorSummary:
        summary = TensorSummary("torch.Tensor", str(t.dtype), list(t.shape), NO_STATS, t.requires_grad)
        if t.numel() == 0 or t.is_meta:
            return summary
        t = t.detach()
        if t.device.type == "cpu":
            summary.stats = _cpu_stats(t)
        else:
            value, kind = _stat_tensor(t)
            summary.stats = None
            self.session.pending.append(PendingStats(value, kind, summary))
        return summary
