"""Two arrays, or two folders of .npy files matched by name, compared as a porting guide compares a network's
outputs or gradients saved on each side: allclose at rtol/atol (and the share of elements within it), cosine
similarity, largest absolute and relative error. No framework imports: tensors come in as numpy arrays.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .metrics import eps_of, tensor_metrics


class NpyDirError(ValueError):
    """A folder or .npy file that cannot be read, named with its path and what was expected."""


@dataclass
class ArrayComparison:
    name: str
    result: str                 # allclose, differs, shape mismatch, only in target, only in golden, unreadable,
    #                             not compared
    shape: tuple | None = None  # the golden's; (target, golden) for a shape mismatch
    close_ratio: float | None = None   # share of elements within rtol/atol
    cosine: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    note: str = ""              # why a file could not be compared (unreadable, not compared)

    @property
    def allclose(self) -> bool:
        return self.result == "allclose"

    def to_json(self) -> dict:
        shape = [list(s) for s in self.shape] if self.result == "shape mismatch" else list(self.shape or ())
        return {"name": self.name, "result": self.result, "allclose": self.allclose, "shape": shape,
                "close_ratio": self.close_ratio, "cosine": self.cosine, "max_abs": self.max_abs,
                "max_rel": self.max_rel, **({"note": self.note} if self.note else {})}

    def line(self) -> str:
        if self.note:
            return f"{self.result:15s} {self.name}: {self.note}"
        if self.result == "shape mismatch":
            return f"{self.result:15s} {self.name} target {self.shape[0]}, golden {self.shape[1]}"
        if self.cosine is None and self.max_abs is None:
            return f"{self.result:15s} {self.name} {self.shape}"
        return (f"{self.result:15s} {self.name} {self.shape}  within tolerance {self.close_ratio:.2%}  "
                f"cosine {self.cosine:.9f}  max|diff| {self.max_abs:.3g}  max rel {self.max_rel:.3g}")


def _floating(a: np.ndarray) -> np.ndarray:
    """A float array of `a`'s values: a complex array as (real, imaginary) pairs, integers and bools widened."""
    if a.dtype.kind == "c":
        return np.stack([a.real, a.imag], axis=-1)
    return a if a.dtype.kind == "f" else a.astype(np.float64)


def compare_arrays(name: str, target, golden, rtol: float = 1e-4, atol: float = 1e-4) -> ArrayComparison:
    """One target array against its golden: allclose (numpy's rule, |t - g| <= atol + rtol * |g|, NaN equal
    to NaN) and the measures of compare's tensor mode (compare/metrics.py)."""
    t, g = np.asarray(target), np.asarray(golden)
    odd = [f"{side} {a.dtype}" for side, a in (("target", t), ("golden", g)) if a.dtype.kind not in "biufc"]
    if odd:  # records, text: no numbers to measure
        return ArrayComparison(name, "not compared", tuple(g.shape),
                               note=f"{', '.join(odd)}: not numbers (expected float, integer, bool or complex)")
    if t.shape != g.shape:
        return ArrayComparison(name, "shape mismatch", (tuple(t.shape), tuple(g.shape)))
    t, g = _floating(t), _floating(g)
    close = np.isclose(t, g, rtol=rtol, atol=atol, equal_nan=True)
    ratio = float(close.mean()) if close.size else 1.0
    m = tensor_metrics(t, g, max(eps_of(str(t.dtype)), eps_of(str(g.dtype))))
    return ArrayComparison(name, "allclose" if bool(close.all()) else "differs", tuple(g.shape), ratio,
                           m["Cosine"], m["MaxAbsErr"], m["MaxRelativeErr"])


def _npy_files(folder: str, role: str) -> dict:
    if not os.path.isdir(folder):
        raise NpyDirError(f"{folder}: no such folder (expected the {role} folder of .npy files)")
    names = sorted(f for f in os.listdir(folder) if f.endswith(".npy") and os.path.isfile(os.path.join(folder, f)))
    if not names:
        raise NpyDirError(f"{folder}: no .npy file in the {role} folder")
    return {name[:-4]: os.path.join(folder, name) for name in names}


def _load(path: str) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":  # numpy would try it as a pickle, and say that instead
                raise NpyDirError(f"{path}: not a .npy file (no .npy header)")
        return np.load(path, allow_pickle=False)
    except NpyDirError:
        raise
    except Exception as exc:  # noqa: BLE001 - numpy raises several types for a bad file
        raise NpyDirError(f"{path}: not a .npy array readable without pickle "
                          f"({' '.join(str(exc).split())[:80] or type(exc).__name__})") from None


def compare_npy_dirs(target_dir: str, golden_dir: str, rtol: float = 1e-4, atol: float = 1e-4) -> list:
    """An ArrayComparison per file name of either folder (golden's order, then the target's extras); files are
    matched by name (`fc1.npy` with `fc1.npy`), as the porting guide's compare_npy_dir and compare_grads_dir
    match the outputs and gradients each side saved."""
    targets, goldens = _npy_files(target_dir, "target"), _npy_files(golden_dir, "golden")
    rows = []
    for name, path in goldens.items():
        try:
            if name not in targets:
                rows.append(ArrayComparison(name, "only in golden", tuple(_load(path).shape)))
                continue
            rows.append(compare_arrays(name, _load(targets[name]), _load(path), rtol, atol))
        except NpyDirError as exc:  # that file's line says so; the others are still compared
            rows.append(ArrayComparison(name, "unreadable", note=str(exc)))
    for name, path in targets.items():
        if name not in goldens:
            try:
                rows.append(ArrayComparison(name, "only in target", tuple(_load(path).shape)))
            except NpyDirError as exc:
                rows.append(ArrayComparison(name, "unreadable", note=str(exc)))
    return rows
