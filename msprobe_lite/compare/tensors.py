"""Tensor mode: the tensor files of every row pair, loaded and measured, in parallel processes when it pays.

Judging goes in record order and needs every row's measures, but measuring one pair of tensor files does not
depend on any other. So the measures are computed first, for all the row pairs of one step/rank pair, by a
pool of processes, and the judge then reads them in order: the result is the same whatever the number of
processes. Each measurement holds two tensors at a time, memory-mapped where the file format allows, and
measures them in float64 chunks (metrics.tensor_metrics), so a worker's memory stays a small multiple of
the largest tensor and the main process holds none.
"""
from __future__ import annotations

import os
import stat
import sys
import time

from .metrics import eps_of, numel, tensor_metrics

# a tensor object's field saying that its file was not written when it was dumped, and why (docs/format.md)
UNWRITTEN = "data_error"
PARALLEL_MIN_ELEMENTS = 1 << 22   # below this much work, starting processes costs more than it saves


class TensorFileError(ValueError):
    """A tensor file that is missing or cannot be loaded, named with the dump.json that names it."""


def tensor_path(dump, data_name: str) -> str:
    """Where the dump keeps the tensor file it names `data_name`: a name from a row's tensor object, which
    rows.Row has checked is a plain file name inside the tensor folder (rows.plain_file_name)."""
    return os.path.join(dump.data_dir or "", data_name)


def load_tensor(path: str, named_by: str):
    """The tensor in `path`: a numpy array for .npy and for dtypes numpy has, a torch tensor for bf16/fp16
    (numpy has no bf16: the metrics convert it to float64 a chunk at a time). Memory-mapped where the file
    allows, so only the chunk being measured is in memory."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:  # gone (a dump folder deleted mid-step, a full disk), or not reachable
        why = "missing" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror}"
        raise TensorFileError(f"{path}: {why} (named by {named_by})") from None
    if stat.S_ISLNK(mode):  # a dump must not make compare read what lies outside it
        raise TensorFileError(f"{path}: a symbolic link (to {os.readlink(path)}): refused, tensor files are read "
                              f"only as plain files inside the dump (named by {named_by})")
    if not stat.S_ISREG(mode):  # a FIFO would block the read
        raise TensorFileError(f"{path}: not a plain file: refused (named by {named_by})")
    try:
        if path.endswith(".npy"):
            import numpy as np
            return np.load(path, mmap_mode="r", allow_pickle=False)
        import torch
        try:
            value = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a file saved without the zip format cannot be memory-mapped
            value = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"holds a {type(value).__name__}, not a tensor")
        return value if value.dtype in (torch.bfloat16, torch.float16) else value.numpy()
    except Exception as exc:  # noqa: BLE001 - any unreadable file becomes one clear error
        raise TensorFileError(f"{path}: cannot load the tensor (named by {named_by}): {exc}") from None


def _shape(array) -> tuple:
    return tuple(array.shape)


def measure(job: tuple) -> dict:
    """Metrics of one row pair: job = (target file, golden file, target dump.json, golden dump.json, eps).
    {"shapes": (t, g)} when the files hold different numbers of elements; {"file_error": why} when one of
    them cannot be read (missing, a symbolic link, not a tensor)."""
    t_path, g_path, t_json, g_json, eps = job
    try:
        a = load_tensor(t_path, t_json)
        b = load_tensor(g_path, g_json)
    except TensorFileError as exc:  # that row's problem (its record errs); every other row is compared
        return {"file_error": str(exc)}
    if _shape(a) != _shape(b):
        return {"shapes": (_shape(a), _shape(b))}
    return tensor_metrics(a, b, eps)


def jobs(pairs, target, golden) -> list:
    """One job per row pair that the judge will measure from files, in record order. A row is listed when
    both sides are tensors of the same shape with a file; the judge measures anything not listed itself."""
    out, seen = [], set()
    for pair in pairs:
        if not (pair.target and pair.golden):
            continue
        g_rows = {r.name[len(pair.golden):]: r for r in golden.rows(pair.golden)}
        for t_row in target.rows(pair.target):
            g_row = g_rows.get(t_row.name[len(pair.target):])
            if g_row is None or not (t_row.is_tensor and g_row.is_tensor):
                continue
            t, g = t_row.obj, g_row.obj
            if not (t.get("data_name") and g.get("data_name")) or list(t_row.shape or []) != list(g_row.shape or []) \
                    or UNWRITTEN in t or UNWRITTEN in g:  # a file not written when dumped: the judge says so
                continue
            key = (tensor_path(target, t["data_name"]), tensor_path(golden, g["data_name"]))
            if key not in seen:
                seen.add(key)
                out.append(key + (target.path, golden.path,
                                  max(eps_of(str(t.get("dtype"))), eps_of(str(g.get("dtype")))), numel(t_row.shape)))
    return out


def init_worker() -> None:
    """A forked worker must not start torch's thread pool that the parent may have used (OpenMP is not
    fork-safe); one thread per process is what a pool of processes wants anyway."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def measure_all(job_list: list, workers: int, progress=None) -> dict:
    """{(target file, golden file): measures} for every job. In `workers` processes when there are at least
    PARALLEL_MIN_ELEMENTS elements to measure; results come back in job order either way."""
    total = sum(j[5] for j in job_list)
    workers = min(workers, len(job_list))
    plain = [j[:5] for j in job_list]
    results = {}
    if workers <= 1 or total < PARALLEL_MIN_ELEMENTS:
        for i, job in enumerate(plain):
            results[job[:2]] = measure(job)
            if progress:
                progress(i + 1, len(plain))
        return results
    from concurrent.futures import ProcessPoolExecutor

    if any(j[0].endswith(".pt") for j in plain):
        import torch  # noqa: F401 - imported once here, inherited by forked workers instead of once in each
    chunk = max(1, min(16, len(plain) // (workers * 8)))
    with ProcessPoolExecutor(workers, initializer=init_worker) as pool:
        for i, (job, measured) in enumerate(zip(plain, pool.map(measure, plain, chunksize=chunk))):
            results[job[:2]] = measured
            if progress:
                progress(i + 1, len(plain))
    return results


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal (never into a log file or a
    pipe), redrawn at most ten times a second."""

    def __init__(self, label: str, stream=None):
        self.label = label
        self.stream = stream or sys.stderr
        self.shown = False
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < 0.1:
            return
        self.last = now
        width = 30
        filled = width * done // max(total, 1)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False
