"""One dump.json read into compact columns, record by record: the columnar compare's input.

`read_table` never holds the file's tree: our dumper's layout (one record per line) is parsed line by line,
any other layout (the reference tool's indented one, a single line) is streamed through json's C scanner
over chunks. Each record is flattened into rows as `rows.record_rows` does, its usual shapes inline and any
other through record_rows itself, so naming and validation are always record_rows'. None means the file is
not one this route handles; the caller then reads it with `read.load_dump`, which says what is wrong.
"""
from __future__ import annotations

import codecs
import json
import os
import re
from array import array
from dataclasses import dataclass
from json.decoder import scanstring
from operator import itemgetter

import numpy as np
from orjson import loads as _fast_loads  # about twice json's speed on a line; json reads what it refuses

from ..core import native
from ..core.small_file import SmallFileError, open_regular
from .dtypes import known_dtype
from .rows import _PARTS, RowError, _is_shape, plain_file_name, record_rows

# a record's part key -> its bit in Table.parts
_PART_BITS = {"input_args": 1, "input_kwargs": 1, "input": 1, "grad_output": 1, "output": 2, "grad_input": 2,
              "parameters": 4}
_ROLE_CODES = {"input": 0, "output": 1}
_TENSOR, _OTHER_TENSOR, _VALUE = 0, 1, 2     # Table.kind
_CHUNK = 1 << 20                             # bytes read at a time by the streaming route
_LINES = 1 << 20                             # bytes of whole lines read at a time by the line route in C
_NAN4 = (float("nan"),) * 4
_BATCH = 16384                               # rows gathered in lists before they move to arrays
_TENSOR_FIELDS = itemgetter("dtype", "shape", "Max", "Min", "Mean", "Norm")
_DIGITS_AS_ZEROS = bytes(48 if 48 <= c <= 57 else 32 for c in range(256))  # bytes.translate: every digit a 0
# 19 digits or more that are no float's fraction, exponent or integer part
_INTEGER_19 = re.compile(rb"(?<![.eE0-9])(?<![eE][+-])[0-9]{19,}(?![0-9.eE])")

try:  # _Builder._usual in C (what it meets first calls back here); optional like the other kernels
    native.require("_fast_table")
    from ._fast_table import Rows as _Rows
except ImportError:  # built without a C compiler
    _Rows = None


@dataclass(eq=False)  # numpy columns: compared by identity, not field by field
class Table:
    """One dump.json as columns: one entry per record, and one per row in rows.record_rows order."""

    path: str
    header: dict          # the top-level keys but "data"
    names: list           # record names, in file order
    spans: np.ndarray     # int64 (n, 2): byte offset and length of each record's value text
    parts: np.ndarray     # uint8 (n,): 1 input keys, 2 output keys, 4 "parameters"
    first_row: np.ndarray  # int64 (n+1,): rows of record i are first_row[i]:first_row[i+1]
    suffix: np.ndarray    # int32 codes into suffixes: a row's name after its record's
    suffixes: list
    role: np.ndarray      # uint8: 0 input, 1 output
    kind: np.ndarray      # uint8: 0 tensor with four float statistics and no md5, 1 other tensor, 2 value
    dtype: np.ndarray     # int32 codes into dtypes
    dtypes: list
    shape: np.ndarray     # int32 codes into shapes (tuples, or None)
    shapes: list
    stats: np.ndarray     # float64 (R, 4): Max, Min, Mean, Norm of kind-0 rows, NaN elsewhere
    grad: np.ndarray      # bool: requires_grad is True
    objs: dict            # row index -> the row's object, for rows of kind 1 and 2
    md5: bool             # some tensor object has an "md5" key


class _Refused(Exception):
    """The file is not one this route reads: read_table answers None."""


class _Builder:
    """The columns as they grow, record by record. A row is its suffix code and its class code: the class
    (kind, role, dtype, shape, requires_grad) is shared by most rows, so a row costs two appends and its
    statistics."""

    def __init__(self):
        self.names, self.plans = [], {}  # plans: a record's keys -> _plan of them
        self.spans, self.parts, self.first_row = array("q"), array("B"), array("q", [0])
        # rows gather in lists (cheaper to append to) and move to the arrays every _BATCH rows
        self.suffix, self.row_class, self.stats, self.done = [], [], [], 0
        self.suffix_done, self.row_class_done, self.stats_done = array("i"), array("i"), array("d")
        self.suffix_codes, self.dtype_codes, self.shape_codes, self.classes = {}, {}, {}, {}
        self.list_codes = {}      # infix -> suffix codes of .{infix}.0, .{infix}.1, ... (grown in place)
        self.tensor_classes = {}  # (dtype, requires_grad, role, *sizes) -> class, for tensors already accepted
        self.value_classes = {}   # (dtype text, role, requires_grad) -> class
        self.objs, self.values = {}, {}  # values: the value objects met, by content, shared between rows
        self.md5 = False
        if _Rows is not None:  # the C route of _usual: it keeps these lists and dicts, so they are never replaced
            self._usual = _Rows(self, plain_file_name, _NAN4, _BATCH)

    def add(self, name, record, offset: int, length: int) -> None:
        """A record and its rows. _fast_table.c's Rows.lines does the same for each line it reads."""
        if record.__class__ is not dict or not name:
            raise _Refused
        self.names.append(name)
        self.spans.append(offset)
        self.spans.append(length)
        keys = tuple(record)
        bits, parts = self.plans.get(keys) or self._plan(keys)
        self.parts.append(bits)
        start = len(self.suffix)
        if not (parts and self._usual(record, parts)):
            self._other_rows(name, record, start)
        if len(self.suffix) >= _BATCH:
            self._flush()
        self.first_row.append(self.done + len(self.suffix))

    def _other_rows(self, name, record, start: int) -> None:
        """A record that is not usual: what _usual appended of it dropped, its rows made by record_rows."""
        self._truncate(start)
        try:
            rows = record_rows(name, record)
        except RowError:
            raise _Refused from None
        for row in rows:
            self._row(name, row)

    def _flush(self) -> None:
        self.done += len(self.suffix)
        self.suffix_done.fromlist(self.suffix)
        self.row_class_done.fromlist(self.row_class)
        self.stats_done.fromlist(self.stats)
        self.suffix.clear()  # emptied in place: the C route holds these lists
        self.row_class.clear()
        self.stats.clear()

    def _plan(self, keys: tuple) -> tuple:
        """(Table.parts bits, (key, infix, role code, suffix codes of its list items) of each part present, in
        row order) for a record's keys; kept in `plans` for the next record of these keys."""
        present = frozenset(keys)
        bits = 0
        for key in present:
            bits |= _PART_BITS.get(key, 0)
        plan = bits, tuple((key, infix, _ROLE_CODES[role], self.list_codes.setdefault(infix, []))
                           for key, infix, role in _PARTS if key in present)
        if len(self.plans) < 4096:
            self.plans[keys] = plan
        return plan

    def _suffix(self, text: str) -> int:
        return self.suffix_codes.setdefault(text, len(self.suffix_codes))

    def _class(self, kind: int, role: int, dtype: str, shape, grad: bool) -> int:
        dtype = self.dtype_codes.setdefault(dtype, len(self.dtype_codes))
        shape = self.shape_codes.setdefault(shape, len(self.shape_codes))
        return self.classes.setdefault((kind, role, dtype, shape, grad), len(self.classes))

    def _usual(self, record: dict, parts: tuple) -> bool:
        """The record's rows appended, if its parts are lists or objects of leaves whose tensors keep rows.Row's
        fast test with four float statistics; False for anything else (record_rows then makes them). One loop
        for the whole record: this runs for every record of a large dump. _fast_table.c's Rows is this in C."""
        suffix, row_class, stats, tensor_classes = self.suffix, self.row_class, self.stats, self.tensor_classes
        try:
            for key, infix, role, known in parts:
                value = record[key]
                if value.__class__ is list:
                    if len(known) < len(value):  # known: the suffix codes of .{infix}.0, .{infix}.1, ...
                        known += [self._suffix(f".{infix}.{i}") for i in range(len(known), len(value) + 8)]
                    pairs = zip(known, value)
                elif value.__class__ is dict:
                    if value.get("type").__class__ is str:  # the part is one leaf: `.output`
                        pairs = ((self._suffix(f".{infix}"), value),)
                    elif "dtype" in value or "shape" in value:  # record_rows says if it is a tensor without type
                        return False
                    else:
                        pairs = [(self._suffix(f".{infix}.{k}"), leaf) for k, leaf in value.items()]
                elif value is None:
                    continue
                else:
                    return False
                for code, leaf in pairs:
                    if leaf.__class__ is not dict or leaf.get("type").__class__ is not str:
                        return False
                    if "dtype" not in leaf or "shape" not in leaf:  # a value: {"type": "float", "value": 1.0}
                        if "shape" in leaf:
                            return False
                        self._value_row(leaf, role, code)
                        continue
                    dtype, shape, mx, mn, mean, norm = _TENSOR_FIELDS(leaf)
                    if not (mx.__class__ is float and mn.__class__ is float and mean.__class__ is float and
                            norm.__class__ is float) or "md5" in leaf:
                        return False  # rarer tensors (integer or null statistics, md5) through rows.Row
                    file_name = leaf.get("data_name")
                    if file_name is not None and not plain_file_name(file_name):
                        return False
                    if shape.__class__ is not list or sum(shape).__class__ is not int:
                        return False
                    # the shape's sizes inline: a key of distinct length per rank, cheaper than a nested tuple
                    tkey = dtype, leaf.get("requires_grad") is True, role, *shape
                    cls = tensor_classes.get(tkey)
                    if cls is None:
                        cls = self._tensor_class(tkey, leaf, role)
                        if cls is None:
                            return False
                    suffix.append(code)
                    row_class.append(cls)
                    stats += mx, mn, mean, norm
        except (KeyError, TypeError):  # a tensor without a statistic; sizes or a dtype of another type
            return False
        return True

    def _value_row(self, leaf: dict, role: int, code: int) -> None:
        """The row of a value leaf ({"type": "float", "value": 1.0}), its object kept, shared with equal ones."""
        vkey = str(leaf.get("dtype", leaf["type"])), role, leaf.get("requires_grad") is True
        cls = self.value_classes.get(vkey)
        if cls is None:
            cls = self._value_class(vkey)
        self.objs[self.done + len(self.suffix)] = self._shared(leaf)
        self.suffix.append(code)
        self.row_class.append(cls)
        self.stats += _NAN4

    def _value_class(self, vkey: tuple) -> int:
        """The class of values not met before; `vkey`: (dtype text, role, requires_grad), its key in value_classes."""
        cls = self.value_classes[vkey] = self._class(_VALUE, vkey[1], vkey[0], None, vkey[2])
        return cls

    def _tensor_class(self, tkey: tuple, leaf: dict, role: int):
        """The class of a tensor not met before (`tkey`: its key in tensor_classes), if it keeps rows.Row's
        tests; else None."""
        dtype, shape = leaf["dtype"], leaf["shape"]
        if dtype.__class__ is not str or not known_dtype(dtype, leaf["type"]) or not _is_shape(shape):
            return None
        cls = self.tensor_classes[tkey] = self._class(_TENSOR, role, dtype, tuple(shape), tkey[1])
        return cls

    def _truncate(self, start: int) -> None:
        del self.suffix[start:], self.row_class[start:], self.stats[4 * start:]
        while self.objs and next(reversed(self.objs)) >= self.done + start:  # the record's own, added last
            self.objs.popitem()

    def _row(self, name: str, row) -> None:
        """A row made by rows.Row, into the columns."""
        if not row.name.startswith(name):
            raise _Refused
        obj = row.obj
        stat = tuple(obj.get(k) for k in ("Max", "Min", "Mean", "Norm"))
        if row.is_tensor:
            self.md5 = self.md5 or "md5" in obj
            kind = _TENSOR if all(s.__class__ is float for s in stat) and "md5" not in obj else _OTHER_TENSOR
        else:
            kind = _VALUE
        try:
            shape = None if row.shape is None else tuple(row.shape)
            cls = self._class(kind, _ROLE_CODES[row.role], row.dtype, shape, obj.get("requires_grad") is True)
        except TypeError:  # a value object's "shape" that is not a list of sizes
            raise _Refused from None
        if kind != _TENSOR:
            self.objs[self.done + len(self.suffix)] = self._shared(obj)
        self.suffix.append(self._suffix(row.name[len(name):]))
        self.row_class.append(cls)
        self.stats += stat if kind == _TENSOR else _NAN4

    def _shared(self, obj: dict) -> dict:
        """One object for equal value objects (the same scalar argument in every call): a table crosses a
        process boundary, and thousands of equal small dicts would weigh more than its columns."""
        try:  # a float by its bits: 0.0 and -0.0 are equal, and NaN unequal to itself
            key = tuple((k, v.__class__, v.hex() if v.__class__ is float else v) for k, v in obj.items())
            return self.values.setdefault(key, obj)
        except TypeError:  # a value holding a list or an object
            return obj

    def table(self, path: str, header: dict) -> Table:
        self._flush()
        n = len(self.names)
        if len(set(self.names)) < n:
            raise _Refused  # a name twice: json would keep the last record only
        # each row's class, spelled out into the columns kind, role, dtype, shape, requires_grad
        classes = np.array(list(self.classes), np.int32).reshape(-1, 5)
        row_class = np.frombuffer(self.row_class_done, np.int32)
        kind, role, dtype, shape, grad = (classes[:, i].take(row_class) for i in range(5))
        return Table(path=path, header=header, names=self.names,
                     spans=np.frombuffer(self.spans, np.int64).reshape(n, 2),
                     parts=np.frombuffer(self.parts, np.uint8),
                     first_row=np.frombuffer(self.first_row, np.int64),
                     suffix=np.frombuffer(self.suffix_done, np.int32), suffixes=list(self.suffix_codes),
                     role=role.astype(np.uint8), kind=kind.astype(np.uint8),
                     dtype=dtype, dtypes=list(self.dtype_codes), shape=shape, shapes=list(self.shape_codes),
                     stats=np.frombuffer(self.stats_done, np.float64).reshape(-1, 4),
                     grad=grad.astype(bool), objs=self.objs, md5=self.md5)


def read_table(path: str, fast_json: bool = True) -> Table | None:
    """`path` (a dump.json) as columns, or None when it is anything but a valid dump this route reads (the
    caller then uses read.load_dump, which names what is wrong). `fast_json`: parse record lines with orjson
    where it is installed."""
    try:
        with open_regular(path, "rb") as f:
            table = _read_lines(path, f, _fast_loads if fast_json else None)
            if table is None:  # not our dumper's layout: streamed from the start
                f.seek(0)
                table = _read_stream(path, f)
    except (_Refused, SmallFileError, OSError, RecursionError, UnicodeDecodeError):
        return None
    if table.header.get("level") == "debug":
        return None
    return table


_DATA = b'"data": {'


def _big_int(line: bytes) -> bool:
    """Whether the line holds an integer of 19 digits or more, wherever it stands: perhaps beyond 64 bits,
    which orjson reads as a float and json exactly. The regex only where translate finds 19 digits in a row
    (a float's, as 0.00012345678901234567, or an integer's): it takes ten times longer."""
    return b"0" * 19 in line.translate(_DIGITS_AS_ZEROS) and _INTEGER_19.search(line) is not None


def _read_lines(path: str, f, fast_loads):
    """Our dumper's layout: the header's keys on the first line ending in `"data": {`, one `"name": {...}`
    per line joined by `,\\n`, then `}}`. None at the first line that is not so (the streaming route reads it);
    _Refused for a record the route refuses."""
    first = f.readline(_CHUNK)  # a longer first line is not our layout's header (a dump on one line)
    if not first.rstrip(b"\r\n").endswith(_DATA):
        return None
    head = first.rstrip(b"\r\n")[:-len(_DATA)].rstrip()
    if head.endswith(b",") and head[:-1].strip() != b"{":  # the header's keys, then the comma before "data"
        try:
            header = json.loads(head[:-1] + b"}")
        except ValueError:
            return None
    elif head.strip() == b"{":
        header = {}
    else:
        return None
    if header.__class__ is not dict or "data" in header:
        return None
    build = _Builder()
    lines = _Lines(build, len(first), fast_loads)
    if fast_loads is not None and _Rows is not None:  # whole lines a chunk at a time, each read in C
        while chunk := f.read(_LINES):
            if not build._usual.lines(chunk + f.readline(), lines):
                return None
    else:
        for line in f:
            if not lines.line(line):
                return None
    return build.table(path, header) if lines.closed else None


class _Lines:
    """Our layout's lines after the header, one at a time: the byte offset of the next one, whether the last
    record line ended with a comma, whether the closing `}}` was read. _fast_table.c's Rows.lines reads the
    usual record lines (ASCII, a plain name) as `line` does, and hands it any other."""

    def __init__(self, build: _Builder, offset: int, fast_loads):
        self.build, self.offset, self.fast_loads = build, offset, fast_loads
        self.scan = json.JSONDecoder().scan_once
        self.comma = self.closed = False

    def line(self, line: bytes) -> bool:
        """A line (its end included) read: its record added, or the end of the data noted; False where the
        file is not in our layout (the streaming route reads it). _Refused for a record the route refuses."""
        text, build, offset = line.decode("utf-8"), self.build, self.offset
        self.offset += len(line)
        if self.closed or not text.startswith('"'):
            if not (self.closed and not text.strip()):
                if self.closed or self.comma or text.strip() != "}}":
                    return False
                self.closed = True
            return True
        if build.names and not self.comma:
            return False  # a record after the last one
        end = len(text.rstrip("\r\n"))
        self.comma = text.endswith(",", 0, end)
        end -= self.comma
        try:
            name, start = scanstring(text, 1)
        except ValueError:
            return False
        if not text.startswith(": ", start):
            return False
        start += 2
        record = None
        if self.fast_loads is not None and not _big_int(line):
            try:
                record = self.fast_loads(text[start:end])
            except ValueError:  # NaN or Infinity, which only json reads
                pass
        if record is None:  # json's scanner itself: no slice, no call through json.loads
            try:
                record, stop = self.scan(text, start)
            except (StopIteration, ValueError):
                return False
            if stop > end or text[stop:end].strip():
                return False
        if text.isascii():
            build.add(name, record, offset + start, end - start)
        else:
            build.add(name, record, offset + len(text[:start].encode()), len(text[start:end].encode()))
        return True


class _Stream:
    """The file's text read in chunks, decoded incrementally; positions are indices into `text`, whose first
    character sits at byte `base` of the file."""

    def __init__(self, f):
        self.f, self.text, self.base, self.eof = f, "", 0, False
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.mark = (0, 0)  # (index, byte offset) of a known position, for non-ASCII text

    def more(self, pos: int) -> int:
        """Drop the text before `pos`, read another chunk; the new index of `pos`. _Refused at the end."""
        if self.eof:
            raise _Refused
        self.base = self.byte(pos)
        self.text = self.text[pos:]
        self.mark = (0, self.base)
        chunk = self.f.read(max(_CHUNK, len(self.text)))
        self.eof = not chunk
        self.text += self.decoder.decode(chunk, final=self.eof)
        return 0

    def byte(self, index: int) -> int:
        if self.text.isascii():
            return self.base + index
        at, byte = self.mark
        if index < at:
            at, byte = 0, self.base
        byte += len(self.text[at:index].encode("utf-8", "surrogatepass"))
        self.mark = (index, byte)
        return byte

    def skip(self, pos: int):
        """Past whitespace to the next character: (pos, that character), reading as needed ('' at the end)."""
        while True:
            n = len(self.text)
            while pos < n and self.text[pos] in " \t\n\r":
                pos += 1
            if pos < n:
                return pos, self.text[pos]
            if self.eof:
                return pos, ""
            pos = self.more(pos)

    def key(self, pos: int):
        """(an object's key, where its value starts, the value's first character) from `pos`."""
        pos, c = self.skip(pos)
        if c != '"':
            raise _Refused
        key, pos = self.string(pos)
        pos, _ = self.expect(pos, ":")
        pos, c = self.skip(pos)
        return key, pos, c

    def string(self, pos: int):
        """The JSON string at `pos` (its opening quote): (text, position after it)."""
        while True:
            try:
                return scanstring(self.text, pos + 1)
            except ValueError:
                pos = self.more(pos)

    def value(self, pos: int, scan):
        """The JSON value at `pos`: (value, its position, the position after it). A value that ends where the
        text ends may be cut (a number, a truncated object): it is read again with more text."""
        while True:
            try:
                value, end = scan(self.text, pos)
                if end < len(self.text) or self.eof:
                    return value, pos, end
            except (StopIteration, ValueError):  # no value here yet, or one cut at the text's end
                pass
            pos = self.more(pos)

    def expect(self, pos: int, chars: str):
        pos, c = self.skip(pos)
        if not c or c not in chars:
            raise _Refused
        return pos + 1, c


def _read_stream(path: str, f) -> Table:
    """Any layout of a dump.json: its top-level object walked key by key, each record read by json's C
    scanner, the text held a chunk (or a record) at a time."""
    decoder = json.JSONDecoder()
    scan = decoder.scan_once
    s = _Stream(f)
    header, build, data = {}, None, False
    pos, _ = s.expect(0, "{")
    pos, c = s.skip(pos)
    if c == "}":
        raise _Refused  # no "data"
    while True:
        key, pos, c = s.key(pos)
        if key == "data":
            if data or c != "{":
                raise _Refused  # a second "data", or one that is not an object
            data, build = True, _Builder()
            pos, c = s.skip(pos + 1)
            if c == "}":
                pos += 1
            else:
                while True:
                    name, pos, _ = s.key(pos)
                    record, pos, end = s.value(pos, scan)
                    at = s.byte(pos)
                    build.add(name, record, at, s.byte(end) - at)
                    pos, c = s.expect(end, ",}")
                    if c == "}":
                        break
        else:
            header[key], _, pos = s.value(pos, scan)
        pos, c = s.expect(pos, ",}")
        if c == "}":
            break
    pos, c = s.skip(pos)
    if c or not data:
        raise _Refused  # text after the object, or no "data"
    return build.table(path, header)


def read_tables(paths: list, parallel: bool) -> list:
    """read_table of each path, in child processes (one per file, at most one per CPU) when `parallel`."""
    if not parallel or len(paths) < 2:
        return [read_table(p) for p in paths]
    from concurrent.futures import ProcessPoolExecutor
    # the first file is read here meanwhile: its table never crosses a process boundary
    with ProcessPoolExecutor(min(len(paths) - 1, os.cpu_count() or 1)) as pool:
        rest = pool.map(read_table, paths[1:])
        return [read_table(paths[0]), *rest]
