"""What compare writes: the CSV table (optionally .xlsx), the whole reasoning of a step in one line
(console.py prints the short block, html_report.py writes report.html)."""
from __future__ import annotations

import csv
import importlib
import io
import json
import math
import operator
import os
import re

from ..core.paths import file_in_the_way, nearest_existing
from ..core.writer import FILE_MODE, make_dirs, write_atomic, write_bytes_atomic
from .read import place, spans

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class OutputError(ValueError):
    """An output folder that cannot be made or written to, named with the reason."""


def output_folder(path: str) -> None:
    """Make the output folder (every level made with the dump's folder mode, 0o750), or say in one line why
    it cannot be: a dangling symbolic link, a file in the way, a file system that refuses folders (/proc)."""
    if os.path.islink(path) and not os.path.exists(path):
        raise OutputError(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist (expected the "
                          f"output folder, or a name for it)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{path}: exists and is not a folder (expected the output folder)")
    try:
        make_dirs(path)
    except OSError as exc:
        absolute = os.path.abspath(path)
        blocker = file_in_the_way(absolute)
        why = f"{blocker} is not a folder" if blocker is not None else \
            f"{exc.strerror} (the file system at {nearest_existing(absolute)} takes no new folders)" \
            if isinstance(exc, FileNotFoundError) else exc.strerror
        raise OutputError(f"{path}: cannot make the output folder: {why}") from None


def unwritable(exc: OSError, folder: str) -> OutputError:
    """A write into the output folder that failed (a full disk, a folder that takes no files), in one line."""
    return OutputError(f"{exc.filename or folder}: cannot write: {exc.strerror or exc} (check the output "
                       f"folder {folder})")


def cell(value):
    """A CSV cell: numbers stay numbers (inf/nan spelled out), text that a spreadsheet would run as a
    formula is neutralised with a leading apostrophe, None is empty, lists are written as JSON."""
    kind = value.__class__
    if kind is float:
        return value if value - value == 0 else ("nan" if value != value else ("inf" if value > 0 else "-inf"))
    if kind is int:
        return value
    if kind is str:
        return "'" + value if value.startswith(_FORMULA_START) else value
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, (int,)):
        return value
    if kind is list and all(x.__class__ is int for x in value):
        text = str(value)  # a shape: the same text as json.dumps, cheaper
    else:
        text = str(value) if not isinstance(value, (list, tuple)) else json.dumps(list(value))
    return "'" + text if text.startswith(_FORMULA_START) else text


# values the csv module already writes as cell() would: floats through repr (inf, nan), ints, bools, None as ""
_AS_IS = frozenset((float, int, bool, type(None)))


def _cells(lines) -> list:
    """The CSV cells of each line (values in column order). Only text and lists go through cell(): a large
    table has millions of numeric cells, and the csv module already spells them the way cell() would."""
    as_is = _AS_IS
    return [[v if v.__class__ in as_is or (v.__class__ is str and not v.startswith(_FORMULA_START)) else cell(v)
             for v in values] for values in lines]


def write_csv(path: str, columns: list, rows: list) -> None:
    """The whole table at once (rows: dicts keyed by column), atomically."""
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows(_cells(map(operator.itemgetter(*columns), rows)))
    write_atomic(path, text.getvalue())


def _render_csv(lines: list) -> bytes:
    """Lines (values in column order) as the table's text."""
    text = io.StringIO(newline="")
    csv.writer(text).writerows(_cells(lines))
    return text.getvalue().encode("utf-8")


def _append(path: str, render, *what) -> None:
    """render(*what) appended to the table; in the writer process, the chunks come in order."""
    data = render(*what)
    with open(path, "ab") as f:
        f.write(data)


class Block:
    """Lines of the table as columns (compare/columnar.py): `texts` {column: its cells' text, already as
    text() makes it (a polars Series, or a list where polars must not run)}, `numbers` a
    float64 array (lines, len(number_columns)), `empty` a bool array of its cells that are empty (None), and
    `cells` {column: {line: value}} for the few cells of those columns that hold anything else (a scalar
    argument's text or integer). Written as the csv module writes the same values (cell(), repr of floats,
    minimal quoting), by polars: its float formatting gives repr's shortest digits many times faster, and
    spelled() spells them as Python does."""

    def __init__(self, texts: dict, numbers, number_columns: list, empty, cells: dict):
        self.texts, self.numbers, self.number_columns = texts, numbers, number_columns
        self.empty, self.cells = empty, cells

    def lines(self, columns: list) -> list:
        """The block's lines, values in column order (what Judge.judge's rows would hold, texts as cells)."""
        texts = {name: list(values) for name, values in self.texts.items()}
        numbers, empty = self.numbers.tolist(), self.empty.tolist()
        out = []
        for i, row in enumerate(numbers):
            values = {name: None if empty[i][j] else row[j] for j, name in enumerate(self.number_columns)}
            values.update({name: odd[i] for name, odd in self.cells.items() if i in odd})
            values.update({name: texts[name][i] for name in texts})
            out.append(tuple(values[name] for name in columns))
        return out


def _render_block_python(columns: list, block: Block) -> bytes:
    """_render_block's text by the csv module: for a process forked from one whose polars threads ran (polars
    would wait for ever for threads that a fork does not copy)."""
    return _render_csv(block.lines(columns))


def _render_block(columns: list, block: Block) -> bytes:
    import numpy as np
    import polars as pl

    data = dict(block.texts)
    numbers, empty = block.numbers, block.empty
    lines = len(numbers)
    # a column whose floats polars writes as repr does stays float (writing it is twice as fast as its text)
    as_text = ~_written_as_floats(numbers, empty)
    as_text[[block.number_columns.index(name) for name in block.cells]] = True
    spell = np.flatnonzero(as_text)
    if spell.size:
        every = spelled(numbers[:, spell].T.ravel())  # one column after the other: each change made once for all
        blank = np.flatnonzero(empty[:, spell].T.ravel())
        if blank.size:
            every = every.scatter(blank, None)
        odd = [(k * lines + i, text(v)) for k, j in enumerate(spell.tolist())
               for i, v in block.cells.get(block.number_columns[j], {}).items()]
        if odd:
            every = every.scatter([at for at, _ in odd], [v for _, v in odd])
        for k, j in enumerate(spell.tolist()):
            data[block.number_columns[j]] = every.slice(k * lines, lines)
    keep = np.flatnonzero(~as_text)
    if keep.size:  # an empty cell as NaN, then null: these columns hold no other NaN
        floats = np.ascontiguousarray(np.where(empty[:, keep], np.nan, numbers[:, keep]).T)
        for k, j in enumerate(keep.tolist()):
            data[block.number_columns[j]] = pl.Series(floats[k], nan_to_null=True)
    frame = pl.DataFrame([data[name].alias(name) for name in columns])
    out = io.BytesIO()
    frame.write_csv(out, include_header=False, line_terminator="\r\n", quote_style="necessary", null_value="")
    return out.getvalue()


def _written_as_floats(numbers, empty):
    """Per column of `numbers`: whether polars' write_csv writes each of its cells that is not `empty` as repr
    does. Where this polars writes a probe otherwise, none is."""
    import numpy as np

    global _WRITES_RIGHT
    if _WRITES_RIGHT is None:
        probe = np.array([0.1, 123.0, 1e15, 1e-04, 1.5e-04, 5.5e-300, 1e-300, 5e-324, 9.99e-10, 0.0, -0.0,
                          1.7976931348623157e-301, 9.999999999999998e15, -2.5, float("inf"), float("-inf")])
        _WRITES_RIGHT = not _spelled_otherwise(probe).any() and _written(probe) == [text(v) for v in probe]
    if not _WRITES_RIGHT:
        return np.zeros(numbers.shape[1], dtype=bool)
    return ~(_spelled_otherwise(numbers) & ~empty).any(axis=0)


def _spelled_otherwise(values):
    """Which of `values` polars spells unlike repr (which spelled() mends): from 1e-09 to 1e-04, from 1e16,
    and NaN (cell() writes nan)."""
    import numpy as np

    size = np.abs(values)
    with np.errstate(invalid="ignore"):
        return ((size >= _ONE_EXPONENT_DIGIT[0]) & (size < _POSITIONAL_IN_POLARS[1]) |
                (size >= _EXPONENT_FROM) & (size != np.inf) | np.isnan(values))


def _written(values) -> list:
    """`values` (floats) as write_csv writes a float column, a text per cell."""
    import polars as pl

    out = io.BytesIO()
    pl.DataFrame([pl.Series("v", values)]).write_csv(out, include_header=False, line_terminator="\n")
    return out.getvalue().decode().split("\n")[:-1]


_WRITES_RIGHT = None  # whether write_csv writes floats outside _spelled_otherwise as repr, with this polars


def as_cells(texts):
    """Text as cell() writes it: a formula's first character behind an apostrophe, an empty text as an
    empty cell (csv writes "" as nothing, polars as two quotes)."""
    import polars as pl

    formula = texts.str.contains("^[=+\\-@\t\r]")
    if formula.any():
        texts = pl.select(pl.when(formula).then(pl.concat_str([pl.lit("'"), texts])).otherwise(texts)).to_series()
    return pl.select(pl.when(texts == "").then(None).otherwise(texts)).to_series()


def text(value):
    """A cell's text as the csv module writes cell(value); None for an empty cell."""
    value = cell(value)
    if value is None or value == "":
        return None
    return value if value.__class__ is str else str(value)


# Python spells a float with an exponent below 1e-04 and from 1e+16, with two exponent digits at least; polars
# gives the same digits, positional down to 1e-05 and with one exponent digit
_POSITIONAL_IN_POLARS = (1e-05, 1e-04)   # 0.0000123 in polars, 1.23e-05 in Python
_ONE_EXPONENT_DIGIT = (1e-09, 1e-05)     # 1.5e-7 in polars, 1.5e-07 in Python
_EXPONENT_FROM = 1e16                     # Python's exponent from here on (+ missing in polars 1)


def spelled(values):
    """Each float64 of `values` as its repr (a polars Series of text; inf and nan as cell() spells them). Where
    this polars spells a probe of every kind otherwise (its versions differ), from repr itself, slowly."""
    import polars as pl

    global _SPELLS_RIGHT
    if _SPELLS_RIGHT is None:
        probe = [1e-05, 1.5e-05, 1e-04, 2.5e-07, 1e-09, 9.99e-10, 1e-300, 5e-324, 0.1, 123.0, 1e15, 1e16,
                 1.7976931348623157e308, 0.0, -0.0, float("inf"), float("-inf"), float("nan"), -1.5e-05]
        _SPELLS_RIGHT = _spelled(__import__("numpy").array(probe)).to_list() == [text(v) for v in probe]
    if not _SPELLS_RIGHT:
        return pl.Series([text(v) for v in values.tolist()], dtype=pl.Utf8)
    return _spelled(values)


_SPELLS_RIGHT = None  # whether _spelled gives repr's text with this polars (tried on the first table)


def _spelled(values):
    import numpy as np
    import polars as pl

    texts = pl.Series(values).cast(pl.Utf8)
    size = np.abs(values)
    with np.errstate(invalid="ignore"):
        positional = np.flatnonzero((size >= _POSITIONAL_IN_POLARS[0]) & (size < _POSITIONAL_IN_POLARS[1]))
        padded = np.flatnonzero((size >= _ONE_EXPONENT_DIGIT[0]) & (size < _ONE_EXPONENT_DIGIT[1]))
        large = np.flatnonzero((size >= _EXPONENT_FROM) & np.isfinite(size))
    nan = np.flatnonzero(np.isnan(values))
    if large.size:  # polars 1 writes 1e16 as 1e16, polars 2 as 1e+16 (repr's)
        texts = texts.scatter(large, texts.gather(large).str.replace(r"e(\d)", "e+${1}"))
    if padded.size:  # 1.5e-7 -> 1.5e-07
        short = texts.gather(padded)
        texts = texts.scatter(padded, pl.select(pl.concat_str([short.str.head(-1), pl.lit("0"),
                                                               short.str.tail(1)])).to_series())
    if positional.size:  # -0.0000123 -> -1.23e-05, 0.00001 -> 1e-05
        text = texts.gather(positional)
        sign = pl.when(text.str.starts_with("-")).then(pl.lit("-")).otherwise(pl.lit(""))
        digits = text.str.strip_prefix("-").str.slice(6)
        rest = pl.when(digits.str.len_bytes() > 1).then(pl.concat_str([pl.lit("."), digits.str.slice(1)]))
        texts = texts.scatter(positional, pl.select(pl.concat_str([
            sign, digits.str.slice(0, 1), rest.otherwise(pl.lit("")), pl.lit("e-05")])).to_series())
    if nan.size:
        texts = texts.scatter(nan, "nan")
    return texts


class CsvSink:
    """The result table, written as the judge produces it, so the rows of a large comparison are never all
    in memory. With `background`, formatting and writing happen in a second process while the judge goes
    on: turning millions of floats into text costs about as much as judging them. With `threads`, chunks are
    formatted in that many threads (blocks of columns: polars formats them without holding the GIL) and
    written here. Either way the chunks are written in the order they were sent, so the file is the same.
    `native`: blocks are formatted by polars, which must not run in a process forked from one whose polars
    threads ran (it would wait for ever for threads that a fork does not copy); else by the csv module, the
    same text."""

    CHUNK = 20000
    AHEAD = 2  # chunks formatted ahead of the writing: the memory a fast producer may take

    def __init__(self, path: str, columns: list, background: bool = False, native: bool = True,
                 threads: int = 0):
        # The table grows in `{path}.partial` (mode 0o640) and takes its name only when complete.
        self.final, self.path, self.columns = path, path + ".partial", columns
        self.pick = operator.itemgetter(*columns)
        self.pending: list = []
        self.process = self.threads = None
        self.futures: list = []
        self.native = native  # polars may run in this process
        self.render_block = _render_block if native else _render_block_python
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        with open(fd, "w", newline="", encoding="utf-8") as f:
            os.fchmod(fd, FILE_MODE)  # the dump's mode, whatever the umask (as writer.write_atomic)
            csv.writer(f).writerow(columns)
        if background:
            from concurrent.futures import ProcessPoolExecutor
            self.process = ProcessPoolExecutor(1)
        elif threads:
            from concurrent.futures import ThreadPoolExecutor
            self.threads = ThreadPoolExecutor(threads)
            if native:  # polars imported there meanwhile (a tenth of a second), not on the first block's way
                self.threads.submit(importlib.import_module, "polars")

    def add(self, rows: list) -> None:
        self.add_lines(list(map(self.pick, rows)))

    def add_lines(self, lines: list) -> None:
        """Lines already as values in column order."""
        self.pending.extend(lines)
        if len(self.pending) >= self.CHUNK:
            self._flush()

    def add_block(self, block: Block) -> None:
        """Lines as columns (compare/columnar.py), after the lines before them."""
        self._flush()
        self._send(self.render_block, self.columns, block)

    def _flush(self) -> None:
        lines, self.pending = self.pending, []
        if lines:
            self._send(_render_csv, lines)

    def _send(self, render, *what) -> None:
        if self.process:
            self.futures.append(self.process.submit(_append, self.path, render, *what))
        elif self.threads:
            self.futures.append(self.threads.submit(render, *what))
        else:
            _append(self.path, render, *what)
        while len(self.futures) > self.AHEAD:  # a slower writer makes the judge wait
            self._done(self.futures.pop(0))

    def _done(self, future) -> None:
        data = future.result()
        if self.threads:
            with open(self.path, "ab") as f:
                f.write(data)

    def close(self) -> None:
        """Write what is left and wait for the writer; a failed write raises here. Then the table takes its
        name."""
        try:
            self._flush()
            while self.futures:
                self._done(self.futures.pop(0))
        finally:
            for pool in (self.process, self.threads):
                if pool:
                    pool.shutdown(cancel_futures=True)
            self.process = self.threads = None
        os.replace(self.path, self.final)


def write_xlsx(path: str, columns: list, rows: list) -> None:
    try:
        from openpyxl import Workbook
        from openpyxl.styles import PatternFill
    except ImportError:
        raise RuntimeError("--xlsx needs openpyxl: pip install openpyxl (the CSV is written regardless)") from None
    fills = {"error": PatternFill("solid", fgColor="FFC7CE"), "warning": PatternFill("solid", fgColor="FFEB9C"),
             "unmatched": PatternFill("solid", fgColor="D9D9D9")}
    book = Workbook()
    sheet = book.active
    sheet.append(columns)
    for row in rows:
        sheet.append([cell(row.get(c)) for c in columns])
        fill = fills.get(row.get("Result"))
        if fill:
            for c in sheet[sheet.max_row]:
                c.fill = fill
    data = io.BytesIO()
    book.save(data)  # openpyxl would write with the umask's mode: written as every other file instead
    write_bytes_atomic(path, data.getbuffer())


def console_line(pair: dict) -> str:
    where = place(pair["step"], pair["rank"])
    c = pair["counts"]
    counts = (f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, "
              f"{c['unmatched_target']} unmatched in target, {c['unmatched_golden']} in golden")
    fd, extra = pair["first_divergence"], pair.get("first_only_in_target")
    # a call the golden run did not make, before any divergence: often the change itself (an added op)
    lost = pair.get("first_only_in_golden")
    only = "; ".join(filter(None, [f"a call only in the target: {extra['name']}{at(extra)}" if extra else "",
                                   f"a call only in the golden (the target does not make it): {lost['name']}"
                                   f"{at(lost)}" if lost else ""]))
    error, seen, warned = pair.get("first_error"), pair.get("first_seen"), pair.get("first_warning")
    if fd is None:
        # errors that no call introduced (a shape that differs, NaN already in the inputs): the first is named;
        # without one, the first call whose inputs differ more than earlier calls explain; without that, the
        # first warning (a call that amplified a difference: LayerNorm's eps changed under bf16, whose inputs
        # already differ by bf16's rounding, reads as one)
        head = "no divergent call found" + (f"; {only}" if only else "") + \
            (f"; first error: {error['name']} -- {error['reason']}{at(error)}" if error else
             f"; first difference seen in the inputs of {seen['name']} -- {seen['reason']}{at(seen)}" if seen else
             f"; first warning: {warned['name']} -- {warned['reason']}{at(warned)}" if warned else "")
    else:
        head = f"first divergence: {fd['name']} -- {fd['reason']}{at(fd)}" + (f"; before it, {only}" if only else "")
    if pair.get("nothing_paired"):
        head = nothing_paired(pair["records"]["target"], pair["records"]["golden"])
    if unread_files(pair):
        head += f"; {unread_files(pair)}"
    note = f" ({pair['note']})" if pair.get("note") else ""
    return f"[{where}]{note} {head}; {counts}"


def unread_files(pair: dict) -> str:
    """`2 tensor files not read, their records erred (first: ...)`, or "": each such record erred with it,
    and the rest was compared."""
    unread = pair.get("tensor_files_not_read") or []
    if not unread:
        return ""
    many = len(unread) > 1
    return (f"{len(unread)} tensor file{'s' if many else ''} not read, {'their' if many else 'its'} "
            f"record{'s' if many else ''} erred (first: {unread[0]})")


def nothing_paired(target: int, golden: int) -> str:
    """The answer of a compare in which no record met one of the other dump: nothing was compared."""
    if not target or not golden:
        held = "neither dump holds a record" if not target and not golden else \
            f"the {'target' if not target else 'golden'} holds no record, the {'golden' if not target else 'target'} " \
            f"{golden or target}"
        return f"nothing paired: {held} (a run that recorded nothing: check its config's step, rank and filters)"
    return (f"nothing paired: none of the target's {target} records meets one of the golden's {golden} (dumps of "
            f"other models, or names that need a mapping, -dm)")


def across_ranks_line(verdict: dict) -> str:
    """The step's verdict across ranks (judge.across_ranks), in one line."""
    parted, received = verdict["parted"], verdict["received"]
    where = f"[step {verdict['step']}] across ranks: "
    got = f"rank {next(iter(received))}" if len(received) == 1 else f"ranks {spans(sorted(received))}"
    if parted:
        made = "; ".join(f"rank {r} ({name})" for r, name in sorted(parted.items()))
        return (f"{where}the runs parted on {made}; {got} only received the difference (DDP's all-reduce or a "
                f"collective brought it)")
    names = set(received.values())
    if len(names) == 1 and next(iter(names)).startswith("Distributed."):
        return (f"{where}every rank's difference comes in at {next(iter(names))} while its inputs agree: the "
                f"collective itself differs")
    return f"{where}{got} received a difference that no rank's line shows being made (a rank not compared?)"


# frames of the frameworks and of the debuggers themselves: never the line to show (a dump of the reference
# tool has torch/nn/modules/module.py innermost); the user's model, in site-packages or not, is
_NOT_THE_USERS = re.compile(r"[\\/](torch|torch_npu|mindspore|msadapter|msprobe|msprobe_lite|_pytest|pluggy)[\\/]")


def users_frame(stack: list):
    """The innermost frame of `stack` outside the frameworks and debuggers (the innermost, if all are)."""
    for frame in stack:
        path = frame[5:frame.find(", line")] if frame.startswith("File ") else frame
        if not _NOT_THE_USERS.search(path):
            return frame
    return stack[0] if stack else None


def at(found: dict) -> str:
    """` at File f, line n, in g: source` of a found call's innermost frame of the user's code, or ""."""
    frame = users_frame(found.get("stack") or [])
    return f" at {frame}".replace(", \n ", ": ") if frame else ""


