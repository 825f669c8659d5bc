"""MindSpore adapter: `from msprobe_lite.mindspore import PrecisionDebugger, seed_all` (PyNative mode).

`NetDifferenceFinder` and `get_weight_map` (a PyTorch network against its MindSpore port) need torch too: they
are imported when first named, so that a MindSpore-only installation imports this package."""
from .debugger import PrecisionDebugger
from .seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all", "NetDifferenceFinder", "get_weight_map"]


def __getattr__(name):
    if name in ("NetDifferenceFinder", "get_weight_map"):
        from . import net_difference

        return getattr(net_difference, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
