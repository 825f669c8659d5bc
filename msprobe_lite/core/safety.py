"""The debugger never stops training: its own failures are reported once, loudly, and swallowed. The user's
own errors are the user's: they are never swallowed.

`guarded` wraps every hook body. The first failure of each kind at each place is logged at ERROR level with
its traceback; repeats are not printed again.

A framework may run the user's operators asynchronously (MindSpore's PyNative pipeline, a CUDA stream): an
operator that fails there raises at the next synchronisation, wherever that is, and with the debugger on it may
be one the debugger makes to read a tensor. The places where the debugger makes the framework finish the
user's queued work run under `users_work`, which marks what they raise as the user's; `report_failure`, which
every report-and-survive site goes through, re-raises a marked exception instead of reporting it, so it reaches
the user unchanged (the same object) from the user's call, as it would without the debugger from the user's
next read.
"""
from __future__ import annotations

import functools
import logging
import sys
import traceback



class FollowingHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr (or `sys.{name}`) is at the time: redirections made after import are
    followed (pytest's capture, a program's own)."""

    def __init__(self, name: str = "stderr"):
        self._stream_name = name  # not `_name`: logging.Handler keeps the handler's own name there
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, _value):
        pass


class _RankTag(logging.Filter):
    """` rank{R}` in every line of a distributed run (`%(rank_tag)s`): each rank says its own warnings, and a
    line printed by one rank of several must say which."""

    tag = ""

    def filter(self, record) -> bool:
        record.rank_tag = self.tag
        return True


_rank_tag = _RankTag()
log = logging.getLogger("msprobe_lite")
if not log.handlers:
    _handler = FollowingHandler()
    _handler.setFormatter(logging.Formatter("[msprobe_lite%(rank_tag)s] %(levelname)s: %(message)s"))
    _handler.addFilter(_rank_tag)  # on the handler: a record of a child logger that reaches it is tagged too
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def set_rank(rank) -> None:
    """The rank of this process, once a session knows it (None: a single-process run, no tag)."""
    _rank_tag.tag = "" if rank is None else f" rank{rank}"

_seen: dict = {}

_USERS = "_msprobe_lite_users_error"  # the mark on an exception raised by the user's own work
_marked_elsewhere: list = []          # the few exception objects that take no attribute (kept, at most 16)


class _UsersWork:
    """`with users_work:` around a point where the debugger makes the framework run the user's queued work (a
    synchronisation before a read of tensor values): an Exception raised there is the user's computation
    failing, not the debugger, and is marked so (see the module's docstring). A KeyboardInterrupt goes to
    the user anyway."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, Exception):
            try:
                setattr(exc, _USERS, True)
            except (AttributeError, TypeError):
                _marked_elsewhere[:] = [*_marked_elsewhere[-15:], exc]
        return False


users_work = _UsersWork()


def is_users(exc: BaseException) -> bool:
    """Whether `exc` was raised by the user's own work run under `users_work`."""
    return getattr(exc, _USERS, False) is True or any(exc is marked for marked in _marked_elsewhere)


def report_failure(where: str, exc: BaseException, site: str | None = None) -> None:
    """Log a debugger failure once per (code site, exception type); training goes on. An exception of the user's
    own work (`is_users`) is raised again instead: each caller calls this in its `except` clause, on the thread
    and inside the call of the user's where the read was made, so the user gets it from there.

    `where` names the instance (which module, which file) for the message; `site` (default: `where`) is what
    makes two failures "the same kind", so a bug hit by every module is printed once, not once per module.
    """
    if is_users(exc):
        raise exc
    key = (site or where, type(exc).__name__)
    count = _seen.get(key, 0)
    _seen[key] = count + 1
    if count == 0:
        try:
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log.error("internal failure in %s: %s: %s -- the data of this call is incomplete; training continues. "
                      "Further failures of this kind are not printed.\n%s",
                      where, type(exc).__name__, exc, detail)
        except Exception:  # noqa: BLE001 - an exception whose text fails: the report is lost, training is not
            pass


def report_unwritable(where: str, exc: OSError) -> None:
    """A dump file or folder the file system refuses (a path below a file, a lost permission, a full disk):
    the user's environment, not a debugger bug, so said plainly, without a traceback, once per kind."""
    key = ("unwritable", type(exc).__name__, getattr(exc, "errno", None))
    count = _seen.get(key, 0)
    _seen[key] = count + 1
    if count == 0:
        log.error("cannot write %s: %s -- check dump_path and the free space there; training continues, and "
                  "each later stop()/step() tries again. Further failures of this kind are not printed.",
                  where, exc)


def guarded(where: str, default=None):
    """Decorator: run the function, and on any Exception report it and return `default` (the user's own error
    is raised again: `report_failure`)."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the whole point: never break the user's training
                report_failure(where, exc, site=fn.__qualname__)
                return default
        return inner
    return wrap
