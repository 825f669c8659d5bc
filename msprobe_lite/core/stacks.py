"""Call stacks for forward records, captured cheaply and stored once per distinct stack.

Walking frames is cheap; formatting them (reading source lines) is not. A stack is identified by its
(code object, line) pairs, so each distinct call site is formatted once per process and every later call
from the same place costs one frame walk and one dict lookup. The walk reads each frame's bytecode offset
(`f_lasti`) rather than its line: Python computes `f_lineno` from the offset through the line table, on every
frame of every call. Line numbers are taken once, the first time a sequence of offsets is seen.
"""
from __future__ import annotations

import linecache
import os
import sys

from . import native

try:  # the same walk in C (several times faster on deep stacks); optional like the other kernels
    native.require("_fast_stack")
    from ._fast_stack import Filer as _Filer, walk as _walk_c
except ImportError:  # built without a C compiler
    _Filer = _walk_c = None


def _package_dir(module_name: str) -> str | None:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _nothing_known(name, frame):
    """`file_known` without the C walk: everything goes to `file_new`."""
    return None


class StackCollector:
    """Captures the user's part of the stack and deduplicates identical stacks within a step.

    Frames inside the debugger and inside the framework packages (torch, mindspore, ...) are not the user's
    code and are left out, as are the interpreter's frozen import machinery frames.

    Every distinct stack has one entry `[names, frames]` for the process; a step files its calls' names there
    and lists the entries it used, in the order it first used them (`_touched`: stack.json's order). Keeping
    the entries, and which walk goes to which, across steps is what lets the C filer file every call of a
    known call site; made anew each step, each call site's first call of every step (in a model's forward,
    most calls) would go through Python.
    """

    def __init__(self, framework_packages=()):
        skip = [_package_dir("msprobe_lite")]
        skip += [_package_dir(name) for name in framework_packages]
        self._skip_prefixes = tuple(p for p in skip if p)
        self._skip_code = {}    # id(code) -> bool (frame is not user code); ints hash fast, code objects don't
        self._codes = {}        # id(code) -> code: keeps every code object seen alive, so ids stay unique
        self._by_offsets = {}   # walk key (code ids and offsets) -> walk id (an int, for this process)
        self._walk_stacks = []  # walk id -> stack key (code ids and lines)
        self._stack_ids = {}    # stack key -> index in self._entries
        self._walk_ids = {}     # walk id -> index in self._entries
        self._entries = []      # [names, frames]: names filed this step (a new list each step)
        self._touched = []      # the entries with names this step, in the order of their first
        self._skip_cache = bytearray(8 * 4096)  # the C walk's copy of _skip_code's decisions (_fast_stack.c)
        # `file` when everything is known already, in C: one call, no Python frame, no object made (the maps
        # and lists above only grow, and reset() empties _touched in place: the filer holds them)
        self.file_known = (_Filer(self._skip_code, self._skip_cache, self._by_offsets, self._walk_ids,
                                  self._entries, self._touched) if _Filer is not None else _nothing_known)

    def reset(self) -> None:
        """A new step: no names filed. Walk ids, stacks and entries are for the process (the C filer's memo
        keeps the walk ids it has seen)."""
        for entry in self._touched:
            entry[0] = []  # a new list: to_json's output keeps the one it was given
        self._touched.clear()

    def _skip(self, code) -> bool:
        key = id(code)
        skip = self._skip_code.get(key)
        if skip is None:
            skip = not self.is_user_file(code.co_filename)
            self._skip_code[key] = skip
            self._codes[key] = code
        return skip

    def file(self, name: str, frame) -> None:
        """Files `name` under the user stack seen from `frame` (None: no Python frame, an empty stack)."""
        found = self.file_known(name, frame)
        if found is not True:
            self.file_new(name, frame, found)

    def file_new(self, name: str, frame, found=None) -> None:
        """`file` where `file_known` met something new (a code, a walk, or the walk's first call this step);
        `found` is what it returned: the walk's key, or None when a code is new (the walk is then Python's)."""
        self.add(name, self._walk_id(frame, found))

    def _walk_id(self, frame, key) -> int:
        """The walk id of `key` (the C walk's), or of the Python walk from `frame` when `key` is None: walks
        are numbered on first sight (when their lines are taken), so a call's key is hashed once."""
        if key is None:
            key = self._walk(frame)  # also decides about the code objects seen for the first time
        walk = self._by_offsets.get(key)
        if walk is None:
            walk = self._by_offsets[key] = len(self._walk_stacks)
            self._walk_stacks.append(self._lines(frame))
        return walk

    def _walk(self, frame) -> tuple:
        """(id(code), offset, id(code), offset, ...) of the user's frames, innermost first."""
        key = []
        skip_code = self._skip_code
        while frame is not None:
            code = frame.f_code
            skip = skip_code.get(id(code))
            if skip is None:
                skip = self._skip(code)
            if not skip:
                key.append(id(code))
                key.append(frame.f_lasti)
            frame = frame.f_back
        return tuple(key)

    def _lines(self, frame) -> tuple:
        lines = []
        while frame is not None:
            if not self._skip(frame.f_code):
                lines.append((id(frame.f_code), frame.f_lineno))
            frame = frame.f_back
        return tuple(lines)

    def add(self, name: str, walk: int) -> None:
        """Files `name` under the stack of `walk` (from `_walk_id`), as the C filer does for known walks."""
        index = self._walk_ids.get(walk)
        if index is None:
            stack = self._walk_stacks[walk]
            index = self._stack_ids.get(stack)
            if index is None:
                frames = self._format(stack)  # before the tables change: a failure leaves them consistent
                index = self._stack_ids[stack] = len(self._entries)
                self._entries.append([[], frames])
            self._walk_ids[walk] = index
        entry = self._entries[index]
        if not entry[0]:
            self._touched.append(entry)
        entry[0].append(name)

    def _format(self, key: tuple) -> list:
        codes = self._codes
        # A frame may have no line (MindSpore's bytecode JIT runs code whose frames report None): no source then
        return [f"File {codes[c].co_filename}, line {line}, in {codes[c].co_name}, \n "
                f"{linecache.getline(codes[c].co_filename, line).strip() if line is not None else ''}"
                for c, line in key]

    def is_user_file(self, filename: str) -> bool:
        """Whether frames of `filename` are the user's (shown in stacks)."""
        return not (filename.startswith("<frozen") or (
            os.path.abspath(filename).startswith(self._skip_prefixes) if self._skip_prefixes else False))

    def outer_walk(self, frame) -> tuple:
        """The key of the user's frames from `frame` outwards, for file_inside()."""
        return self._walk(frame)

    def file_inside(self, name: str, inner: tuple, walk: tuple, frame) -> None:
        """Files `name` (a call inside compiled code) under `inner`, its frames there ((file, line, function,
        source) innermost first, from the compiler's metadata), then the user's frames around the compiled
        call (`walk`, from outer_walk(frame)), less the compiled function's own frame."""
        key = ("inside", inner, walk)
        index = self._stack_ids.get(key)
        if index is None:
            top = (inner[-1][0], inner[-1][2]) if inner else None
            outer = [(c, line) for c, line in self._lines(frame)
                     if (self._codes[c].co_filename, self._codes[c].co_name) != top]
            frames = [f"File {file}, line {line}, in {function}, \n {source}" for file, line, function, source in inner]
            index = self._stack_ids[key] = len(self._entries)
            self._entries.append([[], frames + self._format(tuple(outer))])
        entry = self._entries[index]
        if not entry[0]:
            self._touched.append(entry)
        entry[0].append(name)

    def unfile(self, name: str) -> None:
        """Takes `name` back out of the stacks of this step (a call that raised): the latest filing. A stack
        left without names leaves the step's list (a later call from there lists it again)."""
        for i in range(len(self._touched) - 1, -1, -1):
            names = self._touched[i][0]
            if name in names:
                names.reverse()  # the latest filing is the last: remove() takes the first
                names.remove(name)
                names.reverse()
                if not names:
                    del self._touched[i]
                return

    def frames_of(self, name: str) -> list:
        """The frames filed for `name` (forward records), or []."""
        for names, frames in self._touched:
            if name in names:
                return frames
        return []

    def to_json(self, only=None) -> dict:
        """{index: [names, frames]} of the stacks that name a record this step, in the order of their first;
        with `only` (a set of record names), of those records alone (overflow_check writes few of them)."""
        entries = self._touched if only is None else \
            [[kept, frames] for names, frames in self._touched if (kept := [n for n in names if n in only])]
        return {str(i): entry for i, entry in enumerate(entries)}

    def __len__(self) -> int:
        return len(self._touched)
