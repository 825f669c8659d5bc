"""msprobe_lite: dump two training runs, compare them, and find the first call where the numbers part.

`msprobe_lite.PrecisionDebugger` picks the framework adapter; `msprobe_lite.pytorch.PrecisionDebugger` names
it directly. Framework packages are imported only when an adapter is used.
"""
from __future__ import annotations

__version__ = "0.1.0"


def PrecisionDebugger(config_path=None, task=None, dump_path=None, level=None, step=None):  # noqa: N802
    """The debugger of the framework in use (PyTorch for now)."""
    from .pytorch import PrecisionDebugger as TorchDebugger

    return TorchDebugger(config_path, task=task, dump_path=dump_path, level=level, step=step)


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    from .pytorch import seed_all as torch_seed_all

    torch_seed_all(seed, mode, rm_dropout)


__all__ = ["PrecisionDebugger", "seed_all", "__version__"]
