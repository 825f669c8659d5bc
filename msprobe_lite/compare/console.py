"""The answer a person reads in a terminal (issue 33): per step and rank a short verdict block, each line at
most 160 characters: the verdict and the call, why in a few words, how far it departs, the user's source line,
the counts. The whole reasoning (report.console_line) is behind `--explain`, in summary.json and report.html.

The library writes through the `msprobe_lite.answer` logger (to standard output, as the answer of a command),
never `print`: a program that calls compare() can silence it or send it elsewhere with `logging`.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import textwrap

from ..core.safety import FollowingHandler
from .read import place, spans
from .report import console_line, nothing_paired, unread_files, users_frame

WIDTH = 160
INDENT = "    "


class _AnswerHandler(FollowingHandler):
    """Standard output, as it is at the time; a reader that left (`| head`) ends the command quietly."""

    def handleError(self, record) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):  # the reader left (`| head`): the CLI ends quietly
            raise  # noqa: PLE0704 - re-raises the error being handled
        super().handleError(record)


answer = logging.getLogger("msprobe_lite.answer")
if not answer.handlers:
    _handler = _AnswerHandler("stdout")
    _handler.setFormatter(logging.Formatter("%(message)s"))
    answer.addHandler(_handler)
    answer.setLevel(logging.INFO)
    answer.propagate = False


def say(text: str) -> None:
    answer.info("%s", text)


def width() -> int:
    """WIDTH, or a narrower terminal's width (at least 60)."""
    if not sys.stdout.isatty():
        return WIDTH
    return max(60, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))


def wrapped(text: str, indent: str = INDENT, first: str = "") -> str:
    """`text` in lines that fit the terminal (at most WIDTH characters), the first after `first`, the others
    indented."""
    return "\n".join(textwrap.wrap(text, width(), initial_indent=first, subsequent_indent=indent,
                                   break_long_words=True, break_on_hyphens=False)) or first.rstrip()


def explained(pair: dict) -> str:
    """The whole reasoning of a step (report.console_line), wrapped at WIDTH."""
    return wrapped(console_line(pair))


def _short_path(path: str) -> str:
    """A file's path as a person reads it: relative to the working folder when inside it, else its last three
    parts (`.../models/gpt2/modeling_gpt2.py`)."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        relative = path
    if not relative.startswith(".."):
        return relative
    parts = path.replace("\\", "/").split("/")
    return path if len(parts) <= 4 else ".../" + "/".join(parts[-3:])


def source_line(found: dict) -> str:
    """`model.py:88 in forward: x = self.ln2(x)` for a found call's innermost frame of the user's code."""
    frame = users_frame(found.get("stack") or [])
    if not frame:
        return ""
    text = frame.replace(", \n ", ": ")
    if text.startswith("File ") and ", line " in text:
        path, rest = text[5:].split(", line ", 1)
        line, _, rest = rest.partition(", in ")
        return f"{_short_path(path)}:{line} in {rest}"
    return text


def _verdict(pair: dict):
    """(headline, the found call's dict or None) of a step, in the order console_line says them."""
    fd, extra, lost = pair["first_divergence"], pair.get("first_only_in_target"), pair.get("first_only_in_golden")
    if pair.get("nothing_paired"):
        return nothing_paired(pair["records"]["target"], pair["records"]["golden"]), None
    if fd is not None:
        return f"first divergence: {fd['name']}", fd
    if extra:
        return f"the runs part at a call only in the target: {extra['name']}", extra
    if lost:
        return f"the runs part at a call only in the golden (the target does not make it): {lost['name']}", lost
    for key, words in (("first_error", "first error: "), ("first_seen", "first difference seen in the inputs of "),
                       ("first_warning", "first warning: ")):
        if pair.get(key):
            return f"no divergent call found; {words}{pair[key]['name']}", pair[key]
    return "no divergent call found", None


_PAIRING = ("aligned with ", "with ")  # Judge.judge's first reasons of a pair made by alignment or of a run


def _clauses(reason: str) -> list:
    """A reason's clauses: its parts between "; " outside parentheses (a clause may hold "(at L0, what runs
    between modules; ...)")."""
    clauses, depth, start = [], 0, 0
    for i, c in enumerate(reason):
        depth += (c == "(") - (c == ")")
        if depth <= 0 and reason.startswith("; ", i):
            clauses.append(reason[start:i])
            start = i + 2
    return clauses + [reason[start:]]


def block(pair: dict, where: str | None = None) -> str:
    """A step's verdict block: the verdict and the call, why, how far, where, the counts (and a note).
    `where`: the place it is headed with (default the pair's step and rank)."""
    headline, found = _verdict(pair)
    where = place(pair["step"], pair["rank"]) if where is None else where
    lines = [wrapped(headline, first=f"[{where}] ")]
    if found is not None:
        # how the call was paired ("aligned with ...", "with ... as one call") says what it was compared with,
        # not why: the first clause after those, and the setting that differs where one does
        clauses = [c for c in _clauses(found.get("reason") or "") if not c.startswith(_PAIRING)] or [""]
        why = "; ".join([clauses[0]] + [c for c in clauses[1:] if c.startswith("argument ")])
        if why:
            lines.append(wrapped(why, first=f"{INDENT}why: ", indent=INDENT * 2))
        if isinstance(found.get("output_difference"), float) and "differ by" not in why:
            lines.append(wrapped(f"outputs differ by {found['output_difference']:.3g} of their magnitude, inputs by "
                                 f"{found['input_difference']:.3g}", first=f"{INDENT}how far: ", indent=INDENT * 2))
        where = source_line(found)
        if where:
            lines.append(wrapped(where, first=f"{INDENT}at ", indent=INDENT * 2))
    if pair.get("note"):
        lines.append(wrapped(pair["note"], first=f"{INDENT}note: ", indent=INDENT * 2))
    if unread_files(pair):
        lines.append(wrapped(unread_files(pair), first=INDENT, indent=INDENT * 2))
    c = pair["counts"]
    lines.append(wrapped(f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['unmatched_target']} "
                         f"unmatched in target, {c['unmatched_golden']} in golden", first=INDENT, indent=INDENT * 2))
    return "\n".join(lines)


class Blocks:
    """Says the pairs' verdict blocks as they come, one block for the ranks of a step that say the same: a job
    of hundreds of ranks that agree reads as one answer, not hundreds."""

    def __init__(self):
        self._key = None
        self._pair = None
        self._ranks: list = []

    def add(self, pair: dict) -> None:
        key = (pair["step"], block(pair, where=""))
        if pair["rank"] is not None and key == self._key:
            self._ranks.append(pair["rank"])
            return
        self.close()
        self._key, self._pair, self._ranks = key, pair, [pair["rank"]]

    def close(self) -> None:
        if self._pair is not None:
            step = self._pair["step"]
            ranks = f"ranks {spans(sorted(self._ranks))}"
            where = None if len(self._ranks) == 1 else f"step {step} {ranks}" if step is not None else ranks
            say(block(self._pair, where))
        self._key, self._pair, self._ranks = None, None, []
