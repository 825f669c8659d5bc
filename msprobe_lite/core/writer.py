"""The only code that touches dump files.

Every file is written whole to a temporary name beside its target and renamed into place, so a reader (or a
crash mid-write) never sees half a file. dump.json holds one record per line: still plain JSON, but cheap to
produce, diff and grep.
"""
from __future__ import annotations

import collections
import functools
import itertools
import json
import os
import threading

from .records import SavedTensor, TensorSummary, json_default, json_scalar, json_str
from . import native

try:  # the same bytes as record_lines_python below, several times faster; optional like the statistics kernel
    native.require("_fast_json")
    from ._fast_json import record_lines as _record_lines_c
except ImportError:  # built without a C compiler
    _record_lines_c = None

DIR_MODE = 0o750
FILE_MODE = 0o640


def make_dirs(path: str) -> None:
    """Create `path` and its missing parents, every one with the dump's folder mode.

    (os.makedirs gives the parents it creates the default mode, 0o777 less the umask, not `mode`.)"""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
    except FileNotFoundError:
        head, tail = os.path.split(path)
        if not tail:  # a trailing separator
            head, tail = os.path.split(head)
        if not head or not tail or head == path:
            raise
        make_dirs(head)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:  # made meanwhile by another thread or process
            if not os.path.isdir(path):
                raise


def write_atomic(path: str, text: str, opened=None) -> None:
    """Write `text` to `path` so that readers see either the old file or the whole new one."""
    write_chunks_atomic(path, (text.encode("utf-8"),), opened)


_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_pid = os.getpid()
_temporary: set = set()  # this process's temporary files not yet renamed or removed: none may outlive it


def _forked() -> None:
    global _pid, _temporary
    _pid = os.getpid()
    _temporary = set()  # the parent's temporary files are the parent's


def remove_temporary_files() -> None:
    """On the way out (exit, SIGTERM), after the sessions wrote what they hold: no temporary file of this
    process stays. A write still running on another thread then fails; the process is ending anyway."""
    for tmp in list(_temporary):
        _remove(tmp)


def _remove(tmp: str) -> None:
    _temporary.discard(tmp)
    try:
        os.unlink(tmp)
    except OSError:
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _tmp_name(path: str) -> str:
    """`{path}.tmp-{pid}-{thread}`: every writer thread owns its own temporary name."""
    return f"{path}.tmp-{_pid}-{threading.get_ident()}"


def _open_new(tmp: str) -> int:
    """A new file at `tmp`. O_EXCL: never opened through a link planted at that name, never shared with
    another writer; a leftover (a crash mid-write) is replaced, a removed folder is made again."""
    try:
        fd = os.open(tmp, _TMP_FLAGS, FILE_MODE)
    except FileExistsError:
        os.unlink(tmp)  # removes a link itself, never what it points to
        fd = os.open(tmp, _TMP_FLAGS, FILE_MODE)
    except FileNotFoundError:
        make_dirs(os.path.dirname(tmp) or ".")  # the dump folder was deleted while running
        fd = os.open(tmp, _TMP_FLAGS, FILE_MODE)
    _temporary.add(tmp)
    return fd


def write_bytes_atomic(path: str, data) -> None:
    """One write to `{path}.tmp-{pid}-{thread}`, then a rename: the file appears only when complete."""
    write_chunks_atomic(path, (data,))


def write_chunks_atomic(path: str, chunks, opened=None) -> None:
    """`chunks` (bytes-like, in order) written to `{path}.tmp-{pid}-{thread}`, then a rename; `opened`:
    (temporary name, fd) of a temporary file opened ahead (`Prepared`), else one is made here.

    (A deterministic temporary name is enough: every writer thread owns its own, and it costs a fraction
    of mkstemp's random-name search, which matters at thousands of tensor files per step.) On any failure
    (a full disk, a lost permission) the temporary file is removed and the previous `path`, if any, is left
    as it was."""
    if opened is None:
        tmp = _tmp_name(path)
        fd = _open_new(tmp)
    else:
        tmp, fd = opened
    try:
        try:
            os.fchmod(fd, FILE_MODE)  # the umask may have narrowed the mode given to open
            for data in chunks:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _temporary.discard(tmp)
    except BaseException:
        _remove(tmp)
        raise


def link_or_copy(source: str, target: str) -> None:
    """The same content under a second name: a hard link, or a copy where links are not supported."""
    try:
        if os.path.lexists(target):  # a rewritten step: replace the old file
            os.unlink(target)
        os.link(source, target)
    except OSError:
        with open(source, "rb") as f:
            write_bytes_atomic(target, f.read())


def rank_folder(rank) -> str:
    """`rank{R}` under torch.distributed / MindSpore communication, `rank` in a single-process run."""
    return "rank" if rank is None else f"rank{rank}"


def step_rank_dir(dump_path: str, step: int, rank) -> str:
    return os.path.join(dump_path, f"step{step}", rank_folder(rank))


def dump_json_chunks(header: dict, records, per: int = 4096):
    """dump.json as encoded pieces of `per` records: the header's keys, then `data` with one record per line,
    in execution order. Written piece by piece, a long step never holds its whole text in memory."""
    head = json.dumps(header)[:-1]  # drop the closing brace, `data` goes last
    yield f'{head}, "data": {{'.encode("utf-8")
    records, sep = iter(records), b"\n"
    while True:
        chunk = list(itertools.islice(records, per))
        if not chunk:
            break
        yield sep + record_lines(chunk)
        sep = b",\n"
    yield b"}}\n" if sep == b"\n" else b"\n}}\n"


def record_lines(records: list) -> bytes:
    """`"name": {data}` for each record, one per line (`,\n` between): in C when the kernel is built. Each
    route formats a summary once per call (one chunk of records) and copies its text where it recurs."""
    if _record_lines_c is not None:
        return _record_lines_c(records, TensorSummary, SavedTensor, _json_fallback, _json_name)
    return record_lines_python(records, {})


def record_lines_python(records: list, texts: dict) -> bytes:
    """The Python route of `record_lines`; `texts` (id(summary) -> (summary, JSON text)) lasts one call: a
    summary recurs in several records (the output of one call is the input of the next)."""
    return ",\n".join([f"{_json_name(r.name)}: {value_json(r.data, texts)}" for r in records]).encode("utf-8")


def _json_fallback(value) -> str:
    return json.dumps(value, default=json_default)


def value_json(value, texts: dict) -> str:
    """`json.dumps(value, default=json_default)`, byte for byte, for an encoded record value.

    The usual shapes (dicts with string keys, lists, summaries, scalars) are joined here; a summary's text is
    made once per `record_lines` call and kept in `texts` (by id: the summaries are alive meanwhile), since the
    output of one call is usually the input of the next. The leaves inside lists and dicts (summaries,
    strings, numbers, None: nearly every value of a record) are formatted inline, without a call each.
    Anything else goes through json itself."""
    kind = type(value)
    if kind is list:
        return "[" + ", ".join([_item_json(item, texts) for item in value]) + "]"
    if kind is dict:
        parts = []
        for key, item in value.items():
            if type(key) is not str:  # keys of other types: json's conversion rules
                return _json_fallback(value)
            parts.append(f"{json_str(key)}: {_item_json(item, texts)}")
        return "{" + ", ".join(parts) + "}"
    return _item_json(value, texts)


def _item_json(item, texts: dict) -> str:
    kind = type(item)
    if kind is TensorSummary or kind is SavedTensor:
        known = texts.get(id(item))
        if known is None or known[0] is not item:  # holding the summary: its id cannot be reused meanwhile
            known = texts[id(item)] = (item, item.json_text())
        return known[1]
    if kind is str:
        return json_str(item)
    if kind is list or kind is dict:
        return value_json(item, texts)
    if kind in _SCALARS:
        return json_scalar(item)
    return _json_fallback(item)


_SCALARS = (float, int, bool, type(None))
_json_name = json.encoder.encode_basestring_ascii  # json.dumps(str), byte for byte, without its set-up


def dump_json_text(header: dict, records) -> str:
    return b"".join(dump_json_chunks(header, records)).decode("utf-8")


def write_step(folder: str, header: dict, records, stack: dict | None, construct: dict | None,
               data_file: str = "dump.json", take=lambda path: None) -> None:
    """Write one rank folder of one step: dump.json (or debug.json), and stack/construct when given.
    `take(path)`: a temporary file opened ahead for `path` (`Prepared.take`), or None."""
    make_dirs(folder)
    path = os.path.join(folder, data_file)
    write_chunks_atomic(path, dump_json_chunks(header, records), take(path))
    for name, mapping in zip(EXTRA_FILES, (stack, construct)):
        if mapping is not None:
            path = os.path.join(folder, name)
            write_atomic(path, json_lines(mapping), take(path))


EXTRA_FILES = ("stack.json", "construct.json")  # beside the data file when extra_info is on


def step_files(data_file: str, extra: bool) -> tuple:
    """The files `write_step` writes: the data file, and EXTRA_FILES with `extra`."""
    return (data_file,) + EXTRA_FILES if extra else (data_file,)


def _levels(folder: str) -> tuple:
    """The rank folder, the step folder, the dump root: those a step's write may make, innermost first."""
    step = os.path.dirname(folder)
    return folder, step, os.path.dirname(step)


class Prepared:
    """A step's folder, and temporary files for its JSON files, made on the writer thread while the step runs.

    Making a folder or a file is slow on many file systems, and far slower on a network one
    (docs/performance.md); a step's dump makes five of them. Made ahead, on a thread that waits on the file
    system while the training thread computes (given a core to run on), the step's write only fills and
    renames. A failure here is left to the write, which makes what is missing itself and reports. Whatever
    the step did not use goes when it ends: unused temporary files, and folders left empty (nothing was
    recorded)."""

    def __init__(self, files: FileQueue):
        self._files = files
        self._folders: set = set()   # prepared this step
        self._created: set = set()   # folders that did not exist and were made here (only these are removed)
        self._written: set = set()   # written to this step
        self._opened: dict = {}      # path -> (temporary name, fd), made ahead and not used yet

    def prepare(self, folder: str, names) -> None:
        if folder not in self._folders:
            self._folders.add(folder)
            self._files.submit(functools.partial(self._make, folder, tuple(names)), folder)

    def _make(self, folder: str, names: tuple) -> None:  # on the writer thread
        opened = {}
        levels = _levels(folder)
        try:
            missing = [path for path in levels if not os.path.isdir(path)]
            make_dirs(folder)
            self._created.update(missing)
            for name in names:
                path = os.path.join(folder, name)
                tmp = _tmp_name(path)
                opened[path] = (tmp, _open_new(tmp))
        except OSError:
            pass
        self._opened.update(opened)  # one step, under the GIL: `take` sees all of them or none

    def take(self, path: str):
        """The temporary file opened ahead for `path`, or None (none was, or it is gone: the dump folder was
        removed meanwhile, say; the write then makes its own)."""
        opened = self._opened.pop(path, None)
        if opened is None:
            return None
        tmp, fd = opened
        try:
            there, held = os.stat(tmp, follow_symlinks=False), os.fstat(fd)
            if (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
                return opened
        except OSError:
            pass
        _close_and_remove(tmp, fd)  # a name no longer ours (something planted) is removed too
        return None

    def written(self, folder: str) -> None:
        self._written.add(folder)

    def discard(self) -> None:
        """At the step's end (and at exit, under the session's lock): what was made ahead and not used goes:
        its temporary files, and the folders it made that nothing was written to, if still empty."""
        if not self._folders:
            return
        self._files.wait()
        while self._opened:
            _, (tmp, fd) = self._opened.popitem()
            _close_and_remove(tmp, fd)
        for folder in self._folders - self._written:
            for path in _levels(folder):
                if path not in self._created:
                    break
                try:
                    os.rmdir(path)
                except OSError:  # not empty (another rank's folder, say), or already gone
                    break
        self._folders.clear()
        self._created.clear()
        self._written.clear()

    def drop(self) -> None:
        """In a forked child: the parent's temporary files are the parent's; only the child's copies of their
        descriptors are closed."""
        while self._opened:
            _, (_, fd) = self._opened.popitem()
            try:
                os.close(fd)
            except OSError:
                pass


def _close_and_remove(tmp: str, fd: int) -> None:
    """Close a temporary file made ahead and remove its name: `unlink` removes a link planted there
    itself, never what it points to, so it is safe when the name is no longer ours either."""
    try:
        os.close(fd)
    except OSError:
        pass
    _remove(tmp)


def json_lines(mapping: dict) -> str:
    """A JSON object with one entry per line: readable, and made by the C encoder (`indent` is pure Python)."""
    if not mapping:
        return "{}\n"
    return "{\n" + ",\n".join([f"{_key_json(k)}: {_json_text(v)}" for k, v in mapping.items()]) + "\n}\n"


def _json_text(value) -> str:
    """json.dumps(value), byte for byte, for what construct.json and stack.json hold (str, None, lists of
    them), without json.dumps's set-up: it makes a new encoder per call, most of the cost of a short value,
    and construct.json at mix has an entry per record, mostly None."""
    kind = type(value)
    if kind is str:
        return _json_name(value)
    if value is None:
        return "null"
    if kind is list:
        if value and type(value[0]) is str:  # stack.json's names and frames: one C call per item
            try:
                return "[" + ", ".join(map(_json_name, value)) + "]"
            except TypeError:  # not all of them str
                pass
        return "[" + ", ".join([_json_text(item) for item in value]) + "]"
    return json.dumps(value)


def _key_json(key) -> str:
    """A key as json writes it: construct.json and stack.json have string keys (record names, indices)."""
    return _json_name(key) if type(key) is str else json.dumps({key: 0})[1:-4]


class FileQueue:
    """Writes files on one background thread, in submission order, so the training thread only hands over.

    `wait()` returns once everything submitted is on disk; `stop()`/`step()` and process exit call it.
    A failed write is reported (once per kind) and the rest go on.

    Its lock is reentrant, and a job is counted only once it is queued: a SIGTERM handler that writes the
    step may have interrupted the training thread inside `submit()`, and must neither deadlock on the lock
    nor wait for a job that was never queued.
    """

    def __init__(self):
        self._changed = threading.Condition(threading.RLock())
        self._jobs: collections.deque = collections.deque()
        self._pending = 0   # queued or running; may dip below 0 while an interrupted submit() is unfinished
        self._thread = None
        self._os_failed = False
        self.failed: dict = {}  # where -> the error of its failed write: the session marks those files unwritten

    def submit(self, write, where: str) -> None:
        with self._changed:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="msprobe_lite-writer", daemon=True)
                self._thread.start()
            self._jobs.append((write, where))
            self._pending += 1
            self._changed.notify_all()

    def wait(self) -> None:
        with self._changed:
            while self._pending > 0:
                self._changed.wait()

    def _run(self) -> None:
        from .safety import is_users, report_failure, report_unwritable

        while True:
            with self._changed:
                while not self._jobs:
                    self._changed.wait()
                write, where = self._jobs.popleft()
            try:
                write()
            except OSError as exc:
                self.failed[where] = exc
                # a full disk or a lost permission fails every later file too, with causes that follow from
                # the first (a missing file to link): the first one is the report
                if not self._os_failed:
                    self._os_failed = True
                    report_unwritable(where, exc)
            except Exception as exc:  # noqa: BLE001 - a lost file is reported; training goes on
                self.failed[where] = exc
                if not is_users(exc):  # the user's error is the user's to see, from the training thread: this
                    report_failure(where, exc, site="tensor file writer")  # thread must live on regardless
            finally:
                with self._changed:
                    self._pending -= 1
                    self._changed.notify_all()
