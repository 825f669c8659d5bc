"""What was collected survives the end of the process, and SIGTERM stays the user's.

At exit (including after an uncaught exception) every live session writes what it holds. SIGTERM is watched
by a handler that chains to the one it replaced:
- the default action (no handler of the user's): write every session, remove every temporary file, then die
  of SIGTERM, as without the debugger;
- a handler of the user's (a graceful-shutdown flag, often): the debugger puts the step so far on disk, in
  case that handler ends the process, then calls it and goes on recording; the step's end writes it whole;
- an ignored SIGTERM, or a handler not installed from Python, is left alone (children inherit an ignored
  signal, and a C handler cannot be chained).
A SIGTERM that arrives while this thread writes a step is handled once that write is done, so the write
is never cut short and never leaves its temporary file. The handler is installed when this module is first
imported on the main thread (only the main thread may install one), so a debugger made later in a helper
thread is watched too, and again over a handler the user installs later, at the next start() on the main
thread. A forked child (a DataLoader worker) inherits the sessions but disowns them.
"""
from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref

from . import writer
from .safety import log, users_work

_live: "weakref.WeakSet" = weakref.WeakSet()
_writing = threading.local()      # depth: this thread is inside a session's write
_deferred: list = []              # SIGTERMs that arrived during a write: (handler, signum, frame)
_said_unwatched = False
_installed = False                # the main thread installed a handler of the debugger's once


def register(session) -> None:
    """Track a live session (it has `step_open`, `dirty`, `write_on_exit()`, `write_so_far()`, `disown()`)."""
    _live.add(session)
    watch_sigterm()


def _each_live(write) -> None:
    """`write(session)` for every live session with something to write; one that raises (the user's error
    surfacing at the write) does not keep the others from writing, and is raised after them."""
    failure = None
    for session in list(_live):
        if session.step_open or session.dirty:
            try:
                write(session)
            except BaseException as exc:  # noqa: BLE001 - raised below, once the others are written
                failure = failure or exc
    if failure is not None:
        raise failure


def flush_all() -> None:
    """Every live session writes what it holds; then no temporary file of this process is left."""
    try:
        _each_live(lambda session: session.write_on_exit())
    finally:
        writer.remove_temporary_files()


def write_all_so_far() -> None:
    """Every live session puts its step so far on disk and goes on recording."""
    _each_live(lambda session: session.write_so_far())


atexit.register(flush_all)


class writing:
    """Marks a session's write on this thread (nestable); a SIGTERM handled meanwhile waits for its end."""

    def __enter__(self):
        _writing.depth = getattr(_writing, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        _writing.depth -= 1
        # only the main thread runs signal handlers, so only its writes hold SIGTERMs back
        while not _writing.depth and _deferred and threading.current_thread() is threading.main_thread():
            handler, signum, frame = _deferred.pop(0)
            handler.handle(signum, frame)


class _Handler:
    """The debugger's SIGTERM handler; `previous` is the one it replaced, called as it would have been."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, signum, frame):
        if getattr(_writing, "depth", 0):  # this thread was writing a step: finish it first (`writing`)
            _deferred.append((self, signum, frame))
            return
        self.handle(signum, frame)

    def handle(self, signum, frame):
        if callable(self.previous):
            try:
                write_all_so_far()
            finally:  # the user's handler runs whatever the write met
                with users_work:  # what it raises is the user's, even where it surfaces inside the debugger's code
                    self.previous(signum, frame)
        elif signal.getsignal(signum) is self:  # the default action
            flush_all()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        else:
            # a handler installed later called this one as the one it replaced: without the debugger it
            # would have found SIG_DFL there, which it could not call, so the process goes on
            write_all_so_far()


def watch_sigterm() -> None:
    """Install the handler over the current one, on the main thread, unless it is there already, or SIGTERM
    is ignored, or its handler was not installed from Python. Called at import, for each new session and at
    each start(): a handler the user installs later is wrapped from the next step on, so that a signal in
    the middle of the debugger's work still reaches it as without the debugger (held back until a write is
    whole, its exception raised to the user, the step so far on disk if it ends the process)."""
    global _said_unwatched, _installed
    current = signal.getsignal(signal.SIGTERM)
    if isinstance(current, _Handler) or current is None or current == signal.SIG_IGN:
        return
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGTERM, _Handler(current))
            _installed = True
            return
        except (ValueError, OSError) as exc:  # embedded interpreters may refuse
            reason = str(exc)
    elif _installed:  # the user's own handler replaced the debugger's: it runs as it is
        return
    else:
        reason = "msprobe_lite was imported, and the debugger made, off the main thread"
    if not _said_unwatched and _live:
        _said_unwatched = True
        log.warning("cannot watch SIGTERM (%s): a terminated run loses its current step", reason)


def _forked_child() -> None:
    for session in list(_live):
        session.disown()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked_child)

watch_sigterm()
