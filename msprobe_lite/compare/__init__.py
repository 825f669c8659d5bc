"""Compare two dumps: read -> pair -> measure -> judge -> report.

`compare(target, golden, output_dir)` pairs the records of a target run (the one under suspicion) with those
of a golden run and names the first call whose outputs part while its inputs still agree. Nothing here
imports torch or MindSpore unless tensor files are loaded.

The package itself is callable, so `msprobe_lite.compare(target, golden, output_dir)` and
`from msprobe_lite import compare` work as the docs show, beside `from msprobe_lite.compare import compare`.
"""
import sys
import types

from .api import CompareError, compare

__all__ = ["compare", "CompareError"]


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
