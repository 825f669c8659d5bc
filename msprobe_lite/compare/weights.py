"""Comparing two weight files: a PyTorch state_dict (.pt/.pth), a MindSpore checkpoint (.ckpt) or numpy
arrays (.npz), in any combination. After a checkpoint conversion this is the check that both frameworks start
from the same numbers; between two steps of one run, it shows which parameters moved.

MindSpore names are read in PyTorch's vocabulary (the shared name mapping), so a converted checkpoint pairs
with its source parameter by parameter. Loading unpickles no arbitrary objects unless trusted (the CLI's
--trust-checkpoint, for files the user made).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..core.state_dict import StateDictError, find_state_dict, load_torch_checkpoint, strip_wrapper_prefixes
from .frameworks import MAPPING, TORCH_BOOKKEEPING, load_names
from .metrics import eps_of, tensor_metrics


class WeightsError(ValueError):
    """A weight file that cannot be read, named with its path and what was expected."""


@dataclass
class WeightRow:
    name: str
    result: str          # equal / close / differs / shape mismatch / only in first / only in second
    shape: tuple | None = None
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None


def _torch_arrays(path: str, trust: bool = False) -> dict:
    try:
        import torch
    except ImportError:
        raise WeightsError(f"{path}: reading a PyTorch file needs torch installed") from None
    try:  # a training checkpoint holding it, DDP's `module.` names: found as the conversion finds them
        state, _ = find_state_dict(load_torch_checkpoint(path, trust), torch.is_tensor, path)
    except StateDictError as exc:
        raise WeightsError(str(exc)) from None
    state, _ = strip_wrapper_prefixes(state)
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor) and str(k).rpartition(".")[2] not in TORCH_BOOKKEEPING:
            v = v.detach().cpu()
            out[str(k)] = (v.float() if v.dtype == torch.bfloat16 else v).numpy()
    return out


def _mindspore_arrays(path: str) -> dict:
    try:
        import mindspore as ms
    except ImportError:
        raise WeightsError(f"{path}: reading a MindSpore checkpoint needs mindspore installed") from None
    try:
        params = ms.load_checkpoint(path)
    except Exception:  # noqa: BLE001 - long texts naming the path again
        raise WeightsError(f"{path}: not a MindSpore checkpoint (expected a file that mindspore.save_checkpoint "
                           f"wrote)") from None
    return {k: v.astype(ms.float32).asnumpy() if str(v.dtype) == "BFloat16" else v.asnumpy()
            for k, v in params.items()}


def _numpy_arrays(path: str) -> dict:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in archive.files}
    except Exception as exc:  # noqa: BLE001
        raise WeightsError(f"{path}: not a numpy .npz archive readable without pickle "
                           f"({' '.join(str(exc).split())[:60] or type(exc).__name__})") from None


def load_weights(path: str, names: str = MAPPING, trust: bool = False) -> dict:
    """{PyTorch-style name: numpy array} of a weight file, chosen by its extension; `trust` loads a PyTorch file
    with its pickled code run (weights_only=False)."""
    if not os.path.isfile(path):
        raise WeightsError(f"{path}: no such file (expected a .pt/.pth, .ckpt or .npz weight file)")
    ext = os.path.splitext(path)[1].lower()
    if ext in (".pt", ".pth", ".bin"):
        return _torch_arrays(path, trust)
    if ext == ".npz":
        return _numpy_arrays(path)
    if ext == ".ckpt":
        params = load_names(names)["parameters"]
        renamed = {}
        for name, value in _mindspore_arrays(path).items():
            head, _, leaf = name.rpartition(".")
            leaf = params.get(leaf, leaf)
            renamed[f"{head}.{leaf}" if head else leaf] = value
        return renamed
    raise WeightsError(f"{path}: unknown weight file type {ext!r} (expected .pt, .pth, .bin, .ckpt or .npz)")


def compare_weights(first: str, second: str, names: str = MAPPING, trust: bool = False) -> list:
    """A WeightRow per parameter name of either file, in the first file's order, then the second's extras."""
    a, b = load_weights(first, names, trust), load_weights(second, names, trust)
    rows = []
    for name, x in a.items():
        y = b.get(name)
        if y is None:
            rows.append(WeightRow(name, "only in first", tuple(x.shape)))
            continue
        if x.shape != y.shape:
            rows.append(WeightRow(name, "shape mismatch", (tuple(x.shape), tuple(y.shape))))
            continue
        if x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
            rows.append(WeightRow(name, "equal", tuple(x.shape), 0.0, 0.0, 1.0))
            continue
        m = tensor_metrics(x, y, eps_of(str(x.dtype)))
        tolerance = 16 * max(eps_of(str(x.dtype)), eps_of(str(y.dtype)))
        result = "close" if m["rel_l2"] <= tolerance and not m["nonfinite"] else "differs"
        rows.append(WeightRow(name, result, tuple(x.shape), m["MaxAbsErr"], m["rel_l2"], m["Cosine"]))
    rows += [WeightRow(name, "only in second", tuple(y.shape)) for name, y in b.items() if name not in a]
    return rows
