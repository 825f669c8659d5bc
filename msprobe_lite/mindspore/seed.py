"""seed_all for MindSpore: the same numbers from two runs of the same script, so that their dumps compare.

`rm_dropout=True`, the default here as in msprobe's documentation of its MindSpore `seed_all`, is the one place
where msprobe_lite changes MindSpore on purpose, because the user called it: the dropout cells and functions
become identities (cells created before the call included: their `construct` is replaced on the class).
`seed_all(rm_dropout=False)` keeps them.
"""
from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from ..core.seed import PASS_THROUGH, put_back, replace_function, seed_python
from .api_capture import _optional

_DROPOUT_CELLS = ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "DropoutExt", "Dropout2dExt")
_MINT_NN = _optional("mindspore.mint.nn")
_DROPOUT_FUNCTIONS = ((ops, ("dropout", "dropout1d", "dropout2d", "dropout3d")),
                      (_optional("mindspore.mint.nn.functional"), ("dropout", "dropout2d")))


def _identity_cell(self, x, *args, **kwargs):
    return x


def _identity_function(original):
    def no_dropout(input, *args, **kwargs):  # noqa: A002 - MindSpore's own name
        return original(input, *args, **kwargs) if getattr(no_dropout, PASS_THROUGH) else input
    no_dropout.__name__ = getattr(original, "__name__", "dropout")
    return no_dropout


def remove_dropout():
    """Every dropout cell and functional dropout of ops, mint and nn becomes an identity; idempotent. Returns
    a function that undoes what this call did (NetDifferenceFinder removes dropout for its run only)."""
    cells, functions = [], []
    for namespace in (nn, _MINT_NN):
        for name in _DROPOUT_CELLS:
            cls = getattr(namespace, name, None)
            if isinstance(cls, type) and cls.__dict__.get("construct") is not _identity_cell:
                cells.append((cls, cls.__dict__.get("construct")))
                cls.construct = _identity_cell
    for namespace, names in _DROPOUT_FUNCTIONS:
        for name in names if namespace is not None else ():
            replace_function(namespace, name, _identity_function, functions)

    def undo() -> None:
        put_back(functions)
        for cls, construct in reversed(cells):  # a class's construct: hooks wrap instances, not it
            if construct is None:  # the class inherited its construct
                del cls.construct
            else:
                cls.construct = construct
    return undo


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = True) -> None:
    """Seed `random`, numpy and MindSpore (`mindspore.set_seed`), set PYTHONHASHSEED; `mode=True` makes
    MindSpore's kernels deterministic; `rm_dropout=True` (the default, as msprobe's MindSpore seed_all is
    documented) removes dropout."""
    seed_python(seed, mode, rm_dropout)
    ms.set_seed(seed)
    if mode:
        if hasattr(ms, "set_deterministic"):
            ms.set_deterministic(True)
        else:  # MindSpore before 2.3
            ms.set_context(deterministic="ON")
    if rm_dropout:
        remove_dropout()
