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


# An attribute of the functions remove_dropout puts in place of the frameworks' dropout functions: the function
# replaced, which a later remove_dropout leaves alone (idempotent)
ORIGINAL = "__msprobe_lite_original__"
# set on such a function when the removal is undone while something else wraps it (the debugger's API capture
# wrapped it after it was put in place): it stays, calling the function it replaced as it was called
PASS_THROUGH = "__msprobe_lite_pass_through__"


def replace_function(namespace, name: str, make, replaced: list) -> None:
    """namespace.name = make(namespace.name), unless a removal is in place already (a pass-through one is
    turned on again); what was done is appended to `replaced` for put_back."""
    current = getattr(namespace, name, None)
    if not callable(current):
        return
    if hasattr(current, ORIGINAL):
        if getattr(current, PASS_THROUGH, False):
            setattr(current, PASS_THROUGH, False)
            replaced.append((namespace, name, current, None))
        return
    wrapper = make(current)
    setattr(wrapper, ORIGINAL, current)
    setattr(wrapper, PASS_THROUGH, False)
    setattr(namespace, name, wrapper)
    replaced.append((namespace, name, wrapper, current))


def put_back(replaced: list) -> None:
    """Undo replace_function: the function it replaced back in place where its wrapper still is; a wrapper
    that something else has wrapped since (and would call) passes its calls through unchanged instead."""
    for namespace, name, wrapper, original in reversed(replaced):
        if original is not None and getattr(namespace, name, None) is wrapper:
            setattr(namespace, name, original)
        else:
            setattr(wrapper, PASS_THROUGH, True)
