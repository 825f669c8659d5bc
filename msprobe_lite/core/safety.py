"""The debugger never stops training: its own failures are reported once, loudly, and swallowed.

`guarded` wraps every hook body. The first failure of each kind at each place is logged at ERROR level with
its traceback; repeats are not printed again.
"""
from __future__ import annotations

import functools
import logging
import sys
import traceback



class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (redirections made after import are followed)."""

    @property
    def stream(self):
        return sys.stderr

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
    _handler = _StderrHandler()
    _handler.setFormatter(logging.Formatter("[msprobe_lite%(rank_tag)s] %(levelname)s: %(message)s"))
    _handler.addFilter(_rank_tag)  # on the handler: a record of a child logger that reaches it is tagged too
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def set_rank(rank) -> None:
    """The rank of this process, once a session knows it (None: a single-process run, no tag)."""
    _rank_tag.tag = "" if rank is None else f" rank{rank}"

_seen: dict = {}


def report_failure(where: str, exc: BaseException, site: str | None = None) -> None:
    """Log a debugger failure once per (code site, exception type); training goes on.

    `where` names the instance (which module, which file) for the message; `site` (default: `where`) is what
    makes two failures "the same kind", so a bug hit by every module is printed once, not once per module.
    """
    key = (site or where, type(exc).__name__)
    count = _seen.get(key, 0)
    _seen[key] = count + 1
    if count == 0:
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        log.error("internal failure in %s: %s: %s -- the data of this call is incomplete; training continues. "
                  "Further failures of this kind are not printed.\n%s",
                  where, type(exc).__name__, exc, detail)


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
    """Decorator: run the function, and on any Exception report it and return `default`."""
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
