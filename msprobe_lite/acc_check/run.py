"""acc_check over what the user pointed at: each rank checked, then the summary, the table, the console lines
and the report section written."""
from __future__ import annotations

import json
import os

from ..compare import console
from ..compare.read import DumpError, load_dump, place, resolve
from ..compare.report import OutputError, output_folder, unwritable
from ..core.writer import write_atomic
from . import AccCheckError
from .check import VERDICTS, check_rank
from .html_section import add_to_report
from .table import write_table

SUMMARY = "acc_check_summary.json"


def run(input_path: str, output_path: str, quiet: bool = False) -> dict:
    try:
        dumps = resolve(input_path)
        output_folder(output_path)  # before the replay: a bad -o is said at once
        ranks = [(step, rank, load_dump(path, step, rank)) for step, rank, path in dumps]
    except (DumpError, OutputError) as exc:
        raise AccCheckError(str(exc)) from None
    summary = {"calls": [], "first_failure": None, "counts": dict.fromkeys(VERDICTS, 0), "not_calls": {},
               "ranks": []}
    for step, rank, dump in ranks:
        result = check_rank(dump)
        for call in result["calls"]:
            summary["calls"].append({**call, "step": step, "rank": rank})
        first = result["first_failure"]
        if first is not None and summary["first_failure"] is None:
            summary["first_failure"] = {**first, "step": step, "rank": rank}
        for key, n in result["counts"].items():
            summary["counts"][key] += n
        for key, n in result["not_calls"].items():
            summary["not_calls"][key] = summary["not_calls"].get(key, 0) + n
        summary["ranks"].append({"step": step, "rank": rank, "dump": dump.path, "first_failure": first,
                                 "counts": result["counts"], "not_calls": result["not_calls"],
                                 "seconds": round(result["seconds"], 3)})
        if not quiet:
            console.say(console.wrapped(rank_line(step, rank, result)))
    try:
        write_atomic(os.path.join(output_path, SUMMARY), json.dumps(summary, indent=1, allow_nan=True))
        write_table(os.path.join(output_path, "acc_check_result.csv"), summary["calls"])
        summary["report_section"] = add_to_report(os.path.join(output_path, "report.html"), summary)
    except OSError as exc:
        raise AccCheckError(str(unwritable(exc, output_path))) from None
    return summary


def rank_line(step, rank, result: dict) -> str:
    """The console answer of one rank, in compare's style: the first failure, why, where; the counts."""
    c = result["counts"]
    counts = f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['skipped']} skipped"
    first = result["first_failure"]
    if not result["calls"]:
        return f"[{place(step, rank)}] no API call to replay: the dump holds module records only (level L0); " \
               f"dump at L1 or mix"
    if c["skipped"] == len(result["calls"]):
        return f"[{place(step, rank)}] no call could be replayed ({counts}: the reasons are in {SUMMARY})"
    # most calls skipped (a MindSpore dump of primitives with attributes): no clean bill of health
    few = f"; most calls could not be replayed: the reasons are in {SUMMARY}" \
        if c["skipped"] > len(result["calls"]) / 2 else ""
    if first is None:
        return f"[{place(step, rank)}] no call loses more precision than its dtype explains ({counts}){few}"
    where = console.source_line(first)
    return f"[{place(step, rank)}] first failure: {first['name']} -- {first['reason']}" \
           f"{f' at {where}' if where else ''} ({counts}){few}"
