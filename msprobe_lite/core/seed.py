"""The framework-neutral half of `seed_all`: argument checks and the Python-level generators."""
from __future__ import annotations

import os
import random

import numpy as np


def seed_python(seed, mode, rm_dropout) -> None:
    """Check seed_all's arguments, then seed `random` and numpy and set PYTHONHASHSEED (for child processes)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 32:
        raise ValueError(f"seed_all: seed must be an int in [0, 2**32 - 1], got {seed!r}")
    for name, value in (("mode", mode), ("rm_dropout", rm_dropout)):
        if not isinstance(value, bool):
            raise ValueError(f"seed_all: {name} must be True or False, got {value!r}")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
