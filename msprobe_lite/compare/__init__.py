"""Compare two dumps: read -> pair -> measure -> judge -> report.

`compare(target, golden, output_dir)` pairs the records of a target run (the one under suspicion) with those
of a golden run and names the first call whose outputs part while its inputs still agree. Nothing here
imports torch or MindSpore unless tensor files are loaded.
"""
from .api import CompareError, compare

__all__ = ["compare", "CompareError"]
