"""Tensor summaries for PyTorch: statistics computed once per tensor value, without waiting for the device.

Caching per (identity, `_version`) and tensor files come from `core.summary`. On CPU, float tensors go
through the one-pass kernel of `core.statistics` over their own memory (contiguous, permuted or sliced),
other dtypes and non-finite values through numpy and torch; on an accelerator the four statistics stay a
small device tensor (`PendingStats`) until the step is written, then all of them are fetched in one batch.
"""
from __future__ import annotations

import io
import math
import threading

import numpy as np
import torch
from zlib_ng import zlib_ng

from ..core.records import NO_STATS, SHAPES, PendingStats, TensorSummary, canonical_shape
from ..core.statistics import (FLOAT32_SQUARES, FLOAT64_SQUARES, KERNEL_KINDS, norm_in_range, one_pass,
                               scaled_norm)
from ..core.summary import Summarizer
from ..core.summary import resolve_pending as core_resolve
from ..core.values import MAX_DEPTH, ValueEncoder
from ..core.writer import write_bytes_atomic
from .framework import PLAIN_TENSORS
from ..core import native

try:  # call values to dump values in C: the walk, the cache and CPU float summaries (see _fast_encode.c)
    native.require("_fast_encode", "_fast_stats")
    from ._fast_encode import Encoder as FastEncoder
except ImportError:  # built without a C compiler (it needs the statistics kernel too)
    FastEncoder = None

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
_NUMPY_FLOATS = {torch.float32, torch.float64}
_NUMPY_INTEGERS = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


_NUMPY_MAX = 1 << 16        # up to here numpy's reductions beat torch's per-op dispatch; above, torch's
_ONES = np.ones(_NUMPY_MAX, dtype=np.float32)  # multithreaded kernels win. sum = dot(a, 1): a BLAS pass
# what ndarray.max()/min()/mean() run, without their Python layer (most summarised tensors are small: the layer
# shows); mean() is the sum over the size, bit for bit
_max, _min, _sum = np.maximum.reduce, np.minimum.reduce, np.add.reduce


# dtype -> (the kernel's kind, the dtype its items are viewed as (bf16: raw 2-byte items), the dtype a staged
# copy is made in). float16 has no kernel lane of its own: it is staged as float32.
_ONE_PASS = {torch.float32: ("float32", None, torch.float32), torch.float64: ("float64", None, torch.float64),
             torch.bfloat16: ("bfloat16", torch.int16, torch.bfloat16),
             torch.float16: ("float32", None, torch.float32)}
# dtype -> (kernel kind code, dtype name) of the tensors the C encoder summarises in place (contiguous CPU
# ones): the dtypes the kernel reads as they are, not staged as another
_IN_PLACE_KINDS = {dtype: (KERNEL_KINDS.index(kind), str(dtype))
                   for dtype, (kind, _, staged) in _ONE_PASS.items() if staged is dtype}
# ... and the kinds the encoder reads itself (token ids, positions, targets, masks): codes 3 and 4 are
# _fast_encode.c's KIND_INT64 and KIND_BOOL, after the kernel's
_IN_PLACE_KINDS.update({torch.int64: (len(KERNEL_KINDS), str(torch.int64)),
                        torch.bool: (len(KERNEL_KINDS) + 1, str(torch.bool))})
_STAGING_MAX = 1 << 22   # elements: a staged copy up to 16 MB of float32 reuses one buffer per dtype
# dtype -> 1-D CPU tensor, per thread: the copy and the kernel release the GIL, and summaries are also made
# on other threads (an async collective completes on the backend's, autograd may call hooks on its own)
_staging = threading.local()


def _rows(t: torch.Tensor):
    """(run, stride, rows) when the values of a non-contiguous tensor are `rows` runs of `run` contiguous
    values, `stride` apart, in some order of its dimensions (statistics do not depend on the order): one
    dense block when transposed or permuted (rows == 1), rows when sliced (q, k and v out of one qkv
    projection). None for other layouts (expanded, overlapping, several levels of gaps)."""
    merged = []  # (stride, size) groups, innermost first
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size != 1):
        if merged and stride == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0], merged[-1][1] * size)
        else:
            merged.append((stride, size))
    if not merged or merged[0][0] != 1 or len(merged) > 2:
        return None
    run = merged[0][1]
    if len(merged) == 1:
        return run, run, 1
    stride, rows = merged[1]
    return (run, stride, rows) if stride >= run else None


def _kernel_input(t: torch.Tensor, dtype) -> tuple:
    """(values, run, stride) for the kernel: t's own memory where its layout allows (a contiguous tensor,
    a permuted one, rows of a slice), else a copy into a staging buffer that is reused, so large copies do
    not fault in fresh memory on every call. run == 0: `values` is read whole."""
    n = t.numel()
    if t.dtype is dtype:
        if t.is_contiguous():
            return t.reshape(-1), 0, 0
        layout = _rows(t)
        if layout is not None:  # the memory from the first value to the last; the kernel reads the rows
            run, stride, rows = layout
            return t.as_strided(((rows - 1) * stride + run,), (1,)), run, stride
    if n > _STAGING_MAX:
        return t.to(dtype).reshape(-1), 0, 0  # reshape copies what is not contiguous
    buffers = getattr(_staging, "buffers", None)
    if buffers is None:
        buffers = _staging.buffers = {}
    buffer = buffers.get(dtype)
    if buffer is None or buffer.numel() < n:
        with torch.inference_mode(False):  # made in an inference-mode pass, it would refuse later copies
            buffer = buffers[dtype] = torch.empty(max(n, 4096), dtype=dtype)
    flat = buffer[:n]
    flat.view(t.shape).copy_(t)
    return flat, 0, 0


def _one_pass_stats(t: torch.Tensor, kind: str, read_as, dtype):
    """The C kernel over the tensor's values, read in place where their layout allows (see `_kernel_input`),
    or None when the values are not all finite."""
    if read_as is None and t.dtype is dtype and t.is_contiguous():  # the usual case: one call gives the view
        return one_pass(t.numpy(force=True).ravel(), kind)
    t = t.detach()
    if t.is_neg():  # a lazy negation: the values, not their bits, before any view
        t = t.resolve_neg()
    values, run, stride = _kernel_input(t, dtype)
    if read_as is not None:
        values = values.view(read_as)
    return one_pass(values.numpy(), kind, run, stride)


def _cpu_stats(t: torch.Tensor) -> tuple:
    """Statistics of a non-empty CPU tensor (attached to autograd or not), by the fastest route for its size
    and dtype.

    Floats: the one-pass C kernel when it is built and the values are finite. Otherwise small tensors go
    through numpy over a zero-copy view (one torch dispatch costs more than a numpy reduction there), large
    floats through torch's fused kernels, stacked and fetched in one `tolist()`. This runs for every distinct
    tensor value of the step, so the dtype is dispatched on once and the common path makes few calls.
    """
    dtype = t.dtype
    if one_pass is not None:
        how = _ONE_PASS.get(dtype)
        if how is not None:
            stats = _one_pass_stats(t, *how)
            if stats is not None:
                return stats
    if dtype in _NUMPY_FLOATS:
        if t.numel() > _NUMPY_MAX:
            return _large_float_stats(t.detach())
        return _float_stats(_flat_numpy(t), dtype is torch.float64)
    if dtype in _NUMPY_INTEGERS:
        a = _flat_numpy(t)
        wide = a.astype(np.float64)
        return int(_max(a)), int(_min(a)), float(_sum(wide)) / a.size, math.sqrt(float(np.dot(wide, wide)))
    if dtype is torch.bool:
        a = _flat_numpy(t)
        return bool(a.any()), bool(a.all()), None, None
    t = t.detach()
    if t.is_floating_point():  # bf16/fp16/fp8: statistics accumulate in float32
        if t.numel() > _NUMPY_MAX:
            return _large_float_stats(t)
        return _float_stats(_flat_numpy(t.float()), False)
    value, kind = _stat_tensor(t)
    return _as_stats(value.tolist(), kind)


def _flat_numpy(t: torch.Tensor) -> np.ndarray:
    """A 1-D numpy view of a CPU tensor: `numpy(force=True)` detaches and resolves a lazy conjugation or
    negation (a copy only then) in one call."""
    return t.numpy(force=True).ravel()


def _float_stats(a: np.ndarray, is_float64: bool) -> tuple:
    """float32 or float64 values: Mean and Norm in float32 unless the values are float64 or so large that
    float32 squares could overflow."""
    high, low = float(_max(a)), float(_min(a))
    largest = max(abs(high), abs(low))
    if not is_float64 and norm_in_range(largest, FLOAT32_SQUARES):  # the usual case; false for NaN and Inf
        return high, low, float(np.dot(a, _ONES[:a.size])) / a.size, math.sqrt(float(np.dot(a, a)))
    if not math.isfinite(largest):
        with np.errstate(all="ignore"):  # NaN/Inf are data here, not a numpy warning for the user
            return high, low, float(a.mean(dtype=a.dtype)), math.sqrt(float(np.dot(a, a)))
    a = a.astype(np.float64, copy=False)
    norm = math.sqrt(float(np.dot(a, a))) if norm_in_range(largest, FLOAT64_SQUARES) else scaled_norm(a, largest)
    return high, low, float(a.mean()), norm


def _large_float_stats(t: torch.Tensor) -> tuple:
    """Large CPU floats: three multithreaded passes (aminmax, sum, dot) and one fetch; `vector_norm` would
    cost as much as the other three together. float32 squares overflow past ~1e19: then float64."""
    flat = (t.float() if t.dtype in _LOW_PRECISION or t.element_size() < 2 else t).reshape(-1)
    low, high = torch.aminmax(flat)
    high, low, total, squares = torch.stack((high, low, flat.sum(), torch.dot(flat, flat))).tolist()
    largest = max(abs(high), abs(low))
    bounds = FLOAT64_SQUARES if flat.dtype is torch.float64 else FLOAT32_SQUARES
    if math.isfinite(largest) and not norm_in_range(largest, bounds):
        return high, low, total / flat.numel(), scaled_norm(flat.numpy(), largest)
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
    if kind == "int":  # NaN: a compiled graph's statistics of a value the compiler left out (compiled_partition)
        return (int(values[0]), int(values[1]), values[2], values[3]) if values[0] == values[0] else NO_STATS
    return tuple(values)


def resolve_pending(pending: list) -> None:
    """Fetch every pending device statistic with one transfer per (device, dtype) and fill the summaries."""
    core_resolve(pending, lambda v: (v.device, v.dtype), lambda values: torch.cat(values).tolist(),
                 torch.Tensor.numel, _as_stats)


def tensor_stats(t: torch.Tensor) -> tuple:
    """Statistics of a tensor, synchronously (used by tests and by CPU summaries)."""
    with torch._C.DisableTorchFunction():
        t = t.detach()
        if t.numel() == 0 or t.is_meta:
            return NO_STATS
        if t.is_cpu:
            return _cpu_stats(t)
        value, kind = _stat_tensor(t)
        return _as_stats(value.tolist(), kind)


_DTYPE_NAMES: dict = {}  # torch.dtype -> "torch.float32": str() of a dtype builds the text anew each time


def _encode_size(v):
    return {"type": "torch.Size", "value": list(v)}


def _encode_dtype(v):
    return {"type": "torch.dtype", "value": str(v)}


def _encode_device(v):
    return {"type": "torch.device", "value": str(v)}


def _encode_memory_format(v):
    """As the reference tool writes it: `{"type": "torch.memory_format", "format": "channels_last"}`."""
    return {"type": "torch.memory_format", "format": str(v).replace("torch.", "", 1)}


def _encode_process_group(group):
    """The ranks of a communication group, and their CRC-32 as `group_id` (the text of the rank list, as the
    reference tool takes it), so the same group has the same id in every rank's dump."""
    out = {"type": "torch.ProcessGroup"}
    try:
        ranks = torch.distributed.get_process_group_ranks(group)
    except Exception:  # noqa: BLE001 - a group of another job or a backend without rank lists: the type alone
        return out
    out["group_ranks"] = ranks
    out["group_id"] = f"{zlib_ng.crc32(str(ranks).encode('utf-8')):08x}"
    return out


def _encode_reduce_op(op):
    """`ReduceOp.SUM` (a RedOpType) or a `ReduceOp(...)` object (its `op`): "RedOpType.SUM" either way."""
    return {"type": "torch.distributed.ReduceOp", "value": str(getattr(op, "op", op))}


def _framework_encoders() -> dict:
    """Encoders of torch's own argument types (by type; subclasses by isinstance): sizes, dtypes, devices,
    memory formats, and with torch.distributed the process groups and reduce ops of collectives."""
    encoders = {torch.Size: _encode_size, torch.dtype: _encode_dtype, torch.device: _encode_device,
                torch.memory_format: _encode_memory_format}
    if torch.distributed.is_available():
        encoders[torch.distributed.ProcessGroup] = _encode_process_group
        encoders[torch.distributed.ReduceOp] = _encode_reduce_op
    return encoders


class TorchSummarizer(Summarizer):
    """Summaries of torch tensors; statistics of accelerator tensors are fetched in one batch per step."""

    tensor_ext = TENSOR_EXT
    tensor_type = "torch.Tensor"

    def __init__(self, session):
        super().__init__(session, ValueEncoder(
            lambda v: isinstance(v, torch.Tensor), _framework_encoders(), torch.Tensor))
        self._pending_crc: list = []     # (device copy, summary), async_dump on an accelerator
        if FastEncoder is not None:
            encoder = self.encoder
            self.fast_encode = FastEncoder(
                PLAIN_TENSORS,
                lambda value, depth: encoder.encode(value, self._tensor_leaf, (), depth),
                self._cache, self._fresh, TensorSummary, _IN_PLACE_KINDS, torch.strided, canonical_shape, SHAPES,
                MAX_DEPTH, quiet=self.quiet, crc=zlib_ng.crc32 if self.md5 else None, tainted=self._tainted)
            self.seal = self.fast_encode.seal

    # Every entry point turns torch-function dispatch off: the debugger's own tensor work must neither be
    # recorded by the API capture nor pay its per-call overhead.
    quiet = staticmethod(torch._C.DisableTorchFunction)

    @staticmethod
    def synchronize() -> None:
        """The accelerators in use finish their queued kernels (a CPU run has none). Run only where a read
        has failed or a collected step ends (`Summarizer.settle`): a kernel of the user's that failed leaves
        its device failing every later call, the debugger's reads too, and the error is the user's."""
        for name in ("cuda", "xpu", "npu"):
            backend = getattr(torch, name, None)
            initialized = getattr(backend, "is_initialized", None)
            if initialized is not None and initialized():
                backend.synchronize()

    @staticmethod
    def version(t):
        try:
            return t._version
        except RuntimeError:  # an inference tensor (torch.inference_mode) keeps no version counter
            return None

    @staticmethod
    def grad_flag(t):
        return t.requires_grad

    @staticmethod
    def extent(t):
        try:
            storage = t.untyped_storage()
            start = storage.data_ptr()
            return start, start + storage.nbytes()
        except Exception:  # noqa: BLE001 - no storage to read (sparse, nested, a subclass's): all memory
            return None

    @staticmethod
    def address(t):
        try:
            return t.data_ptr()
        except Exception:  # noqa: BLE001 - no memory of its own to read: counted as tainted
            return None

    def _resolve_device(self) -> None:
        if self.session.pending:
            resolve_pending(self.session.pending)
            self.session.pending = []
        for copy, summary in self._pending_crc:
            summary.md5 = crc32_hex(copy.cpu())
        self._pending_crc = []

    def _snapshot(self, t):
        copy = t.detach().clone()
        return copy if self.defer else copy.cpu()  # async_dump: no transfer until the step ends

    def _write(self, copy, path: str) -> None:
        save_tensor(copy.cpu(), path)

    def _summarize(self, t: torch.Tensor) -> TensorSummary:
        dtype = t.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype)
        summary = TensorSummary("torch.Tensor", name, canonical_shape(t.shape), NO_STATS, t.requires_grad)
        if t.is_meta:
            return summary
        if t.numel() == 0:
            if self.md5:
                summary.md5 = "00000000"
            return summary
        if t.is_cpu:
            if self.md5:
                summary.md5 = crc32_hex(t)
            summary.stats = _cpu_stats(t)
        else:
            t = t.detach()
            if self.md5:
                if self.defer:
                    self._pending_crc.append((t.clone(), summary))
                else:
                    summary.md5 = crc32_hex(t.cpu())
            value, kind = _stat_tensor(t)
            summary.stats = None
            self.session.pending.append(PendingStats(value, kind, summary))
        return summary
