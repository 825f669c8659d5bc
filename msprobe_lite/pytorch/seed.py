"""seed_all: make two runs of the same script produce the same numbers, so that their dumps compare.

`rm_dropout=True` is the one place where msprobe_lite changes PyTorch on purpose, because the user asked:
every dropout function becomes an identity. `nn.Dropout` (and the attention modules) call these functions at
run time, so instances created before the call are covered too.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from ..core.seed import PASS_THROUGH, put_back, replace_function, seed_python

_DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def _identity_dropout(original):
    @functools.wraps(original)
    def no_dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - PyTorch's own name
        return original(input, p, training and getattr(no_dropout, PASS_THROUGH), inplace)
    return no_dropout


def _identity_torch_dropout(original):
    @functools.wraps(original)
    def no_dropout(input, p, train):  # noqa: A002 - PyTorch's own name
        return original(input, p, train and getattr(no_dropout, PASS_THROUGH))
    return no_dropout


def _no_attention_dropout(original):
    @functools.wraps(original)
    def sdpa(*args, **kwargs):
        if getattr(sdpa, PASS_THROUGH):
            return original(*args, **kwargs)
        if len(args) > 4:
            args = args[:4] + (0.0,) + args[5:]
        else:
            kwargs["dropout_p"] = 0.0
        return original(*args, **kwargs)
    return sdpa


def remove_dropout():
    """Make every functional dropout (and so every dropout module) an identity; idempotent. Returns a function
    that undoes what this call did (NetDifferenceFinder removes dropout for the time of its run only)."""
    replaced: list = []
    for name in _DROPOUTS:
        replace_function(F, name, _identity_dropout, replaced)
    replace_function(torch, "dropout", _identity_torch_dropout, replaced)
    replace_function(F, "scaled_dot_product_attention", _no_attention_dropout, replaced)
    from .api_capture import see_through  # a debugger made before: its capture knows the new functions
    see_through(replaced)
    return functools.partial(put_back, replaced)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """Seed `random`, numpy and torch (CUDA too), set PYTHONHASHSEED; `mode=True` turns on deterministic
    algorithms (and the cuBLAS workspace setting they need); `rm_dropout=True` removes dropout."""
    seed_python(seed, mode, rm_dropout)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if mode:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    if rm_dropout:
        remove_dropout()
