"""Tensor summaries for PyTorch: statistics computed once per tensor value, without waiting for the device.

A tensor that is the output of one call and the input of the next is summarised once: summaries are cached
by (object identity, version counter) for the step, and an in-place change bumps the version, so the cache
never returns stale numbers. On CPU the four statistics come back in one `tolist()`; on an accelerator they
stay a small device tensor (`Pending`) until the step is written, then all of them are fetched in one batch.
"""
from __future__ import annotations

import functools
import io
import math
import os
import weakref

import numpy as np
import torch
from zlib_ng import zlib_ng

from ..core.naming import data_file_name
from ..core.records import NO_STATS, Pending, SavedTensor, TensorSummary
from ..core.values import ValueEncoder
from ..core.writer import link_or_copy, make_dirs, write_bytes_atomic

TENSOR_EXT = ".pt"


def crc32_hex(t: torch.Tensor) -> str:
    """CRC-32 of a CPU tensor's raw bytes in its own dtype (C-contiguous, little-endian), 8 hex digits."""
    raw = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8).numpy()
    return f"{zlib_ng.crc32(raw):08x}"


def save_tensor(t: torch.Tensor, path: str) -> None:
    """A CPU tensor to `path`, loadable with torch.load(weights_only=True); appears only when complete.

    Serialised in memory first: torch.save straight to a file makes many small writes."""
    buffer = io.BytesIO()
    torch.save(t, buffer)
    write_bytes_atomic(path, buffer.getbuffer())

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
        config = session.config
        self.md5 = config.task == "statistics" and config.statistics.summary_mode == "md5"
        self.defer = config.async_dump   # device values and files wait for the end of the step
        self._cache: dict = {}
        self._snapshots: dict = {}       # id -> (weakref, version, first file): a value is saved once a step
        self._folders: set = set()       # tensor folders already created
        self._pending_crc: list = []     # (device copy, summary), async_dump on an accelerator
        self._deferred_files: list = []  # (write, path), async_dump: queued when the step is written
        self.encoder = ValueEncoder(
            lambda v: isinstance(v, torch.Tensor),
            {torch.Size: _encode_size, torch.dtype: _encode_dtype, torch.device: _encode_device}, torch.Tensor)

    def resolve(self) -> None:
        """Before the step is written: fetch pending device statistics and CRCs, queue deferred files."""
        with torch._C.DisableTorchFunction():
            self._resolve()

    def _resolve(self) -> None:
        if self.session.pending:
            resolve_pending(self.session.pending)
            self.session.pending = []
        for copy, summary in self._pending_crc:
            summary.md5 = crc32_hex(copy.cpu())
        self._pending_crc = []
        for write, path in self._deferred_files:
            self.session.files.submit(write, path)
        self._deferred_files = []

    def reset(self) -> None:
        self._cache.clear()
        self._snapshots.clear()

    def forget(self, tensors) -> None:
        """Drop cached summaries of tensors changed without a version bump (collectives write in place)."""
        for t in tensors:
            self._cache.pop(id(t), None)

    # Every entry point turns torch-function dispatch off: the debugger's own tensor work must neither be
    # recorded by the API capture nor pay its per-call overhead.
    # `save_as` (a record name) also saves each tensor to a file named after its place in that record.
    def encode(self, value, path: tuple = (), save_as: str | None = None):
        with torch._C.DisableTorchFunction():
            return self.encoder.encode(value, self._leaf(save_as), path)

    def encode_call(self, args, kwargs, save_as: str | None = None) -> tuple:
        """(input_args, input_kwargs) of a call, encoded in one pass."""
        leaf = self._leaf(save_as)
        with torch._C.DisableTorchFunction():
            return (self.encoder.encode(args, leaf, ("input_args",)),
                    self.encoder.encode(kwargs, leaf, ("input_kwargs",)))

    def encode_output(self, output, save_as: str | None = None) -> list:
        """`output` is always a list: a tuple/list result is encoded item by item, anything else is wrapped."""
        if isinstance(output, (list, tuple)) and not hasattr(output, "_fields"):
            return self.encode(output, ("output",), save_as)
        return [self.encode(output, ("output", 0), save_as)]

    def summarize(self, t: torch.Tensor, fresh: bool = False, save_as: str | None = None, path: tuple = ()):
        """Summary of `t` now; `fresh` skips the cache (for buffers changed behind autograd's back)."""
        with torch._C.DisableTorchFunction():
            summary = self._cached(t, fresh)
            return self._saved(t, summary, save_as, path) if save_as is not None else summary

    def _leaf(self, save_as):
        if save_as is None:
            return self._tensor_leaf
        return lambda t, path: self._saved(t, self._cached(t), save_as, path)

    def _saved(self, t, summary, record: str, path: tuple) -> SavedTensor:
        """Save the value of `t` now as `{record}.{category}.{index}.pt`. A value already saved this step
        (the output of one call is the input of the next) is not copied or serialised again: its file gets
        a second name (a hard link)."""
        name = data_file_name(record, path, TENSOR_EXT)
        folder = self.session.tensor_folder()
        target = os.path.join(folder, name)
        if folder not in self._folders:
            make_dirs(folder)
            self._folders.add(folder)
        key, version = id(t), t._version
        cached = self._snapshots.get(key)
        if cached is not None and cached[0]() is t and cached[1] == version:
            write = functools.partial(link_or_copy, cached[2], target)
        else:
            copy = t.detach().clone()
            try:
                self._snapshots[key] = (weakref.ref(t), version, target)
            except TypeError:
                pass
            if self.defer:  # keep the (device) copy until the step ends; no transfer now
                self._deferred_files.append((lambda c=copy, p=target: save_tensor(c.cpu(), p), target))
                return SavedTensor(summary, name)
            write = functools.partial(save_tensor, copy.cpu(), target)
        if self.defer:
            self._deferred_files.append((write, target))
        else:
            self.session.files.submit(write, target)
        return SavedTensor(summary, name)

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
        if t.is_meta:
            return summary
        if t.numel() == 0:
            if self.md5:
                summary.md5 = "00000000"
            return summary
        t = t.detach()
        if self.md5:
            if t.device.type == "cpu":
                summary.md5 = crc32_hex(t)
            elif self.defer:
                self._pending_crc.append((t.clone(), summary))
            else:
                summary.md5 = crc32_hex(t.cpu())
        if t.device.type == "cpu":
            summary.stats = _cpu_stats(t)
        else:
            value, kind = _stat_tensor(t)
            summary.stats = None
            self.session.pending.append(PendingStats(value, kind, summary))
        return summary
