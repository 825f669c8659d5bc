"""The statistics a compiled graph computes of its tensors (forward values and gradients), and how they become
records' TensorSummary objects: read at once on CPU, left on the device until the step is written elsewhere.

A tensor's statistics are a float64 row: (Max, Min, Mean, Norm), and for a tensor with dynamic sizes also its
element count and sizes. A tensor leaf of a record's template is ("t", slot, dtype, shape, requires_grad):
`slot` is the offset of its row in the graph's statistics vector (None: empty, no statistics), `shape` has
None for a dynamic size.
"""
from __future__ import annotations

import torch

from ..core.records import NO_STATS, PendingStats, TensorSummary

STATS_WIDTH = 4


def _accumulated(t):
    """`t` detached, in the precision its statistics accumulate in: integers and booleans in float64
    (booleans' Max/Min become any/all when recorded), floats in their own precision, at least float32 (as eager
    summaries do)."""
    x = t.detach()
    if x.dtype == torch.float64 or not x.is_floating_point():
        return x.to(torch.float64)
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def stats_of(t):
    """(Max, Min, Mean, Norm) of `t` as a float64 vector: traced into the compiled graph."""
    x = _accumulated(t)
    return torch.stack([x.amax(), x.amin(), x.mean(), torch.linalg.vector_norm(x)]).to(torch.float64)


def stats_of_sized(t):
    """stats_of for a tensor whose sizes are dynamic, maybe empty: (Max, Min, Mean, Norm, numel, *sizes)."""
    x = _accumulated(t)
    flat = x.reshape(-1)
    n = flat.numel()
    zero = flat.new_zeros(())
    high = torch.cat([flat, flat.new_full((1,), float("-inf"))]).amax()
    low = torch.cat([flat, flat.new_full((1,), float("inf"))]).amin()
    mean = flat.sum() / (zero + torch.sym_max(n, 1))
    sizes = [zero + n] + [zero + d for d in x.shape]
    return torch.stack([high, low, mean, torch.linalg.vector_norm(flat), *sizes]).to(torch.float64)


def stats_for(t):
    """stats_of, or stats_of_sized where `t`'s sizes are dynamic (tracing)."""
    return stats_of(t) if all(isinstance(d, int) for d in t.shape) else stats_of_sized(t)


def _as_stats(values, kind):
    """pytorch/summary.py's conversion of a statistics row (imported on use: that module imports the
    framework module, which imports this one)."""
    from .summary import _as_stats as convert  # noqa: PLC0415
    return convert(values, kind)


def _kind(dtype: str) -> str:
    return "bool" if dtype == "torch.bool" else "int" if "int" in dtype else "float"


def summary(leaf, rows) -> TensorSummary:
    """The TensorSummary of template `leaf` from the statistics vector's values `rows` (a list)."""
    _, slot, dtype, shape, requires_grad = leaf
    stats = NO_STATS
    if slot is not None and None in shape:  # dynamic sizes: read with the statistics
        numel = int(rows[slot + STATS_WIDTH])
        shape = tuple(int(d) for d in rows[slot + STATS_WIDTH + 1:slot + STATS_WIDTH + 1 + len(shape)])
        if numel == 0:
            slot = None
    if slot is not None and rows[slot] == rows[slot]:  # NaN: a value the compiler left out (compiled_partition)
        stats = _as_stats(rows[slot:slot + STATS_WIDTH], _kind(dtype))
    return TensorSummary("torch.Tensor", dtype, shape, stats, requires_grad)


def reads_now(rows, dynamic) -> bool:
    """Whether statistics rows are read at once (on CPU, or with dynamic sizes), else left pending."""
    return rows.is_cpu or dynamic


def reader(rows, dynamic, pending):
    """Turns a tensor's template into its TensorSummary: from the values on CPU (and where sizes are dynamic),
    else left on the device as PendingStats in `pending` until the step is written (no synchronisation)."""
    if reads_now(rows, dynamic):
        values = rows.detach().cpu().tolist()
        return lambda leaf: summary(leaf, values)

    def read(leaf):
        _, slot, dtype, shape, requires_grad = leaf
        if slot is None:
            return TensorSummary("torch.Tensor", dtype, shape, NO_STATS, requires_grad)
        made = TensorSummary("torch.Tensor", dtype, shape, None, requires_grad)
        pending.append(PendingStats(rows[slot:slot + STATS_WIDTH], _kind(dtype), made))
        return made
    return read
