"""Reading a small text file the user names (a config, a name map): the one place every such reader goes through.

Why not `open().read()`: a user's path may name `/dev/zero` (read forever, memory grows by gigabytes), a FIFO
(`open` blocks until a writer comes) or a huge file given by mistake. Only a regular file of at most
`MAX_BYTES` is read; anything else is a `SmallFileError` that says what the path is and what was expected.
"""
from __future__ import annotations

import os
import stat

MAX_BYTES = 4 * 1024 * 1024  # configs and name maps are a few KB: 4 MiB leaves room and bounds the memory
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class SmallFileError(ValueError):
    """A path that is not a small readable text file: `expected` says what was wanted and what the path is."""

    def __init__(self, path, expected: str) -> None:
        self.path, self.expected = os.fspath(path), expected
        super().__init__(self.path, expected)  # args rebuild the error when it is pickled

    def __str__(self) -> str:
        return f"{self.path}: expected {self.expected}"


def _size(count: int) -> str:
    return f"{count / 2 ** 30:.1f} GiB" if count >= 2 ** 30 else f"{count:,} bytes"


def file_kind(mode: int):
    """What a path of this `st_mode` is when it is not a regular file ("a FIFO (named pipe)"), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check_regular(path, mode: int, size: int, max_bytes) -> None:
    kind = file_kind(mode)
    if kind is not None:
        raise SmallFileError(path, f"a readable regular file, but this is {kind}")
    if max_bytes is not None and size > max_bytes:
        raise SmallFileError(path, f"a file of at most {max_bytes // 2 ** 20} MiB, but this one holds {_size(size)}")


def open_regular(path, mode: str = "r", max_bytes=None):
    """`path` opened for reading (text as UTF-8, or bytes with mode "rb") if it is a regular file of at most
    `max_bytes` (None: any size). Anything else is a SmallFileError naming the path and what it is; the
    OSError of a path that cannot be opened (FileNotFoundError, PermissionError) is left to the caller.
    Checked before opening (opening a device can do things) and again on the open file; opened without
    blocking, so a FIFO swapped in meanwhile is refused at once rather than waited on forever."""
    before = os.stat(path)
    _check_regular(path, before.st_mode, before.st_size, max_bytes)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        opened = os.fstat(fd)
        _check_regular(path, opened.st_mode, opened.st_size, max_bytes)
        return open(fd, mode, encoding=None if "b" in mode else "utf-8", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_small_text(path) -> str:
    """The UTF-8 text of `path` (a byte-order mark is dropped). Raises SmallFileError for a missing or unreadable
    path, anything but a regular file, more than MAX_BYTES, or bytes that are not UTF-8."""
    try:
        with open_regular(path, "rb", MAX_BYTES) as f:
            data = f.read(MAX_BYTES + 1)  # st_size can be 0 for files that still hold bytes (/proc): count them
    except SmallFileError:
        raise
    except FileNotFoundError:
        raise SmallFileError(path, "the path of an existing file (not found)") from None
    except (OSError, ValueError) as exc:  # ValueError: a path holding NUL
        raise SmallFileError(path, f"a readable file ({type(exc).__name__}: {exc})") from None
    if len(data) > MAX_BYTES:
        raise SmallFileError(path, f"a file of at most {MAX_BYTES // 2 ** 20} MiB, but this one holds more")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SmallFileError(path, f"a UTF-8 text file ({exc})") from None
