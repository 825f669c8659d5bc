"""MindSpore adapter: `from msprobe_lite.mindspore import PrecisionDebugger, seed_all` (PyNative mode)."""
from .debugger import PrecisionDebugger
from .seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all"]
