"""The optional C routes, and the switch that keeps them out: with MSPROBE_LITE_PURE_PYTHON=1 in the environment
none is imported and every record comes from the Python routes (the test suite's second lane runs so, which
is what shows that installing needs no C compiler). A comma-separated list of extension names instead
(`_fast_stack,_fast_json`) keeps out only those: tools/bench_native.py measures what each one saves."""
from __future__ import annotations

import os

EXTENSIONS = ("_fast_capture", "_fast_encode", "_fast_stats", "_fast_stack", "_fast_json", "_fast_table")
_SETTING = os.environ.get("MSPROBE_LITE_PURE_PYTHON", "").strip()
PURE_PYTHON = _SETTING not in ("", "0") and not set(_SETTING.split(",")) <= set(EXTENSIONS)
LEFT_OUT = frozenset(EXTENSIONS) if PURE_PYTHON else frozenset(_SETTING.split(",")) & set(EXTENSIONS)


def require(*extensions: str) -> None:
    """Called before a C route's import, in its `try`: the ImportError of a package built without them."""
    out = LEFT_OUT.intersection(extensions)
    if out:
        raise ImportError(f"MSPROBE_LITE_PURE_PYTHON: {', '.join(sorted(out))} not used")
