"""What compare writes: the CSV table (optionally .xlsx), the whole reasoning of a step in one line
(console.py prints the short block, html_report.py writes report.html)."""
from __future__ import annotations

import csv
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


def _append_csv(path: str, lines: list) -> None:
    """One chunk of lines (values in column order) appended to the table; runs in the writer process."""
    with open(path, "a", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(_cells(lines))


class CsvSink:
    """The result table, written as the judge produces it, so the rows of a large comparison are never all
    in memory. With `background`, formatting and writing happen in a second process while the judge goes
    on: turning millions of floats into text costs about as much as judging them.
    The one writer process takes the chunks in the order they were sent, so the file is the same."""

    CHUNK = 20000

    def __init__(self, path: str, columns: list, background: bool = False):
        # The table grows in `{path}.partial` (mode 0o640) and takes its name only when complete.
        self.final, self.path, self.columns = path, path + ".partial", columns
        self.pick = operator.itemgetter(*columns)
        self.pending: list = []
        self.pool = self.futures = None
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        with open(fd, "w", newline="", encoding="utf-8") as f:
            os.fchmod(fd, FILE_MODE)  # the dump's mode, whatever the umask (as writer.write_atomic)
            csv.writer(f).writerow(columns)
        if background:
            from concurrent.futures import ProcessPoolExecutor
            self.pool, self.futures = ProcessPoolExecutor(1), []

    def add(self, rows: list) -> None:
        self.pending.extend(map(self.pick, rows))
        if len(self.pending) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        lines, self.pending = self.pending, []
        if not lines:
            return
        if self.pool:
            self.futures.append(self.pool.submit(_append_csv, self.path, lines))
            while len(self.futures) > 3:  # a slower writer makes the judge wait: at most 3 chunks in memory
                self.futures.pop(0).result()
        else:
            _append_csv(self.path, lines)

    def close(self) -> None:
        """Write what is left and wait for the writer; a failed write raises here. Then the table takes its
        name."""
        try:
            self._flush()
            for future in self.futures or ():
                future.result()
        finally:
            if self.pool:
                self.pool.shutdown(cancel_futures=True)
                self.pool = None
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


