"""Tensor summaries for MindSpore: statistics, CRC-32 and `.npy` files of `mindspore.Tensor` values.

On the CPU the numbers come from a zero-copy numpy view (`asnumpy()`) and the shared numpy rules of
`core.statistics`; on an accelerator the four statistics are one small device tensor per value, fetched in
one batch when the step is written, so no hook waits for the device. bf16 has no numpy arithmetic:
statistics accumulate it in float32 and `.npy` files hold it as float32 (the spec's rule). MindSpore
tensors carry no version counter, so no summary is reused across calls (see `core.summary`).

Before it reads a value (`asnumpy()` waits for MindSpore's queued operators) the summarizer settles that
queue (`Summarizer.settle`): an operator of the user's that failed there (one without a kernel on this
device) is the user's error, raised to the user.
"""
from __future__ import annotations

import io

import mindspore as ms
import numpy as np
from mindspore import ops
from zlib_ng import zlib_ng

from ..core.records import NO_STATS, PendingStats, TensorSummary, canonical_shape
from ..core.statistics import numpy_stats
from ..core.summary import Summarizer
from ..core.summary import resolve_pending as core_resolve
from ..core.values import ValueEncoder
from ..core.writer import write_bytes_atomic
from .framework import _pynative_executor

TENSOR_TYPE = "mindspore.Tensor"
_NO_NUMPY_MATH = ("bfloat16",)   # numpy dtypes (from ml_dtypes) that numpy cannot reduce


def as_numpy(t: ms.Tensor) -> np.ndarray:
    """The tensor's value as a numpy array in its own dtype (bf16 included), a view where MindSpore allows."""
    return t.asnumpy()


def _computable(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) if array.dtype.name in _NO_NUMPY_MATH else array


def tensor_stats(t: ms.Tensor) -> tuple:
    """(Max, Min, Mean, Norm) of a tensor, synchronously, by the spec's rules."""
    if t.size == 0:
        return NO_STATS
    with np.errstate(all="ignore"):  # NaN/Inf are data here, not a numpy warning for the user
        return numpy_stats(as_numpy(t))


def crc32_hex(t: ms.Tensor) -> str:
    """CRC-32 of the tensor's raw bytes in its own dtype (C-contiguous, little-endian), 8 hex digits."""
    return f"{zlib_ng.crc32(np.ascontiguousarray(as_numpy(t)).view(np.uint8)):08x}"


def device_stats(t: ms.Tensor):
    """The four statistics as one float32 device tensor (no transfer), with the kind `_as_stats` needs.

    Only operators with kernels on every backend (MindSpore 2.10's `mint.norm` has none on the CPU)."""
    if t.dtype == ms.bool_:
        return ops.stack((t.any(), t.all())).astype(ms.float32), "bool"
    wide = t.astype(ms.float64 if t.dtype in (ms.float64, ms.int64, ms.int32) else ms.float32)
    nan = ops.isnan(wide).any().astype(wide.dtype)  # max/min skip NaN on some backends: it must show
    value = ops.stack((wide.max(), wide.min(), wide.mean(), ops.norm(wide.reshape(-1)), nan))
    return value, ("int" if not ops.is_floating_point(t) else "float")


def _as_stats(values, kind: str) -> tuple:
    if kind == "bool":
        return bool(values[0]), bool(values[1]), None, None
    if kind == "int":
        return int(values[0]), int(values[1]), float(values[2]), float(values[3])
    high, low, mean, norm, nan = (float(v) for v in values)
    return (float("nan"), float("nan"), mean, norm) if nan else (high, low, mean, norm)


def resolve_pending(pending: list) -> None:
    """One transfer per dtype for every statistic still on the device."""
    core_resolve(pending, lambda v: str(v.dtype), lambda values: ops.cat(values).asnumpy().tolist(),
                 lambda v: v.size, _as_stats)


def save_npy(array: np.ndarray, path: str) -> None:
    """A `.npy` file (bf16 as float32, loadable with allow_pickle=False), appearing only when complete."""
    buffer = io.BytesIO()
    np.save(buffer, _computable(array), allow_pickle=False)
    write_bytes_atomic(path, buffer.getbuffer())


def _encode_dtype(v):
    return {"type": "mindspore.dtype", "value": str(v)}


class MindSporeSummarizer(Summarizer):
    tensor_ext = ".npy"
    tensor_type = TENSOR_TYPE

    def __init__(self, session, quiet=None):
        super().__init__(session, ValueEncoder(lambda v: isinstance(v, ms.Tensor),
                                               {ms.dtype.Type: _encode_dtype}, ms.Tensor))
        self._quiet = quiet

    def quiet(self):
        """The API capture's own switch: MindSpore calls made here are not the user's."""
        return self._quiet() if self._quiet is not None else super().quiet()

    # PyNative runs operators on a pipeline: a failed one raises at the next synchronisation (cheap when nothing
    # is queued), which the summarizer makes before each read (an executor without it: no settling)
    synchronize = staticmethod(getattr(_pynative_executor, "sync", None) or Summarizer.synchronize)

    def _resolve_device(self) -> None:
        if self.session.pending:
            resolve_pending(self.session.pending)
            self.session.pending = []

    def _snapshot(self, t):
        self.settle()
        return np.array(as_numpy(t))  # a copy: the tensor may change in place later

    def _write(self, copy, path: str) -> None:
        save_npy(copy, path)

    def _summarize(self, t: ms.Tensor) -> TensorSummary:
        summary = TensorSummary(TENSOR_TYPE, str(t.dtype), canonical_shape(t.shape), NO_STATS)
        if t.size == 0:
            if self.md5:
                summary.md5 = "00000000"
            return summary
        on_device = str(getattr(t, "device", "CPU")).upper().startswith("CPU") is False
        if self.md5 or not on_device:
            self.settle()
        if self.md5:
            summary.md5 = crc32_hex(t)
        if on_device:
            value, kind = device_stats(t)
            summary.stats = None
            self.session.pending.append(PendingStats(value, kind, summary))
        else:
            summary.stats = tensor_stats(t)
        return summary
