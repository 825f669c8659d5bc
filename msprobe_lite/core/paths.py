"""Checks on a folder path the user names (a dump path, an output folder) before anything is made there."""
from __future__ import annotations

import os


def nearest_existing(path: str) -> str:
    """The nearest path above `path` (an absolute path) that exists, the root at worst: where making the
    folder would start. `path` is taken as written: a `..` in it is left for the kernel to resolve."""
    above = os.path.dirname(path)
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    return above


def file_in_the_way(path: str) -> str | None:
    """The nearest existing path above `path` (an absolute path) when it is not a folder (a file, a dangling
    symbolic link): no folder can ever be made at `path` then. None when it is a folder."""
    above = nearest_existing(path)
    return above if os.path.lexists(above) and not os.path.isdir(above) else None
