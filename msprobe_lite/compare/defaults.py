"""Default values of PyTorch APIs' keyword arguments (issue 32). msprobe_lite records the arguments an API is
dispatched with, which for `F.cross_entropy` include the defaults its Python code fills in (`ignore_index=-100`,
`reduction='mean'`); the reference tool records what the caller wrote. An argument one run passes with its
default value is the argument the other run left out, not a setting that differs.
"""
from __future__ import annotations

import functools
import inspect

_OWNERS = {"Functional": "torch.nn.functional", "Torch": "torch", "Tensor": "torch.Tensor"}
_NONE = object()


@functools.lru_cache(maxsize=1024)
def _defaults(base: str) -> dict:
    """{keyword: default} of the API named by a record's base (`Functional.cross_entropy`), {} where unknown
    (PyTorch is imported on the first such question: only a pair with a one-sided keyword asks)."""
    prefix, _, api = base.partition(".")
    owner_name = _OWNERS.get(prefix)
    if owner_name is None:
        return {}
    try:
        import torch  # noqa: PLC0415 - imported only when asked
    except Exception:  # noqa: BLE001 - no PyTorch here: no defaults known
        return {}
    owner = torch
    for part in owner_name.split(".")[1:]:
        owner = getattr(owner, part, None)
    func = getattr(owner, api, None)
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return {}
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def is_default(base: str, keyword: str, value) -> bool:
    default = _defaults(base).get(keyword, _NONE)
    return default is not _NONE and type(default) is type(value) and default == value
