"""The optional C routes, and the switch that keeps them out: with MSPROBE_LITE_PURE_PYTHON=1 in the environment
none is imported and every record comes from the Python routes (the test suite's second lane runs so, which
is what shows that installing needs no C compiler)."""
from __future__ import annotations

import os

PURE_PYTHON = os.environ.get("MSPROBE_LITE_PURE_PYTHON", "") not in ("", "0")


def require() -> None:
    """Called before a C route's import, in its `try`: the ImportError of a package built without them."""
    if PURE_PYTHON:
        raise ImportError("MSPROBE_LITE_PURE_PYTHON=1: the C routes are not used")
