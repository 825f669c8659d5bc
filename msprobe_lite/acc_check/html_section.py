"""acc_check's section in a report.html that compare wrote to the same output folder: the answer per rank and
the calls that are not a pass. Written between two markers, so that a second run replaces its own section."""
from __future__ import annotations

import html
import os

from ..compare.read import place
from ..core.writer import write_atomic

BEGIN, END = "<!-- acc_check -->", "<!-- /acc_check -->"


def section(summary: dict) -> str:
    parts = [f"{BEGIN}<section id='acc_check'><h2>acc_check: every call replayed in float64</h2>"]
    for r in summary["ranks"]:
        c, first = r["counts"], r["first_failure"]
        answer = f"first failure: {first['name']} -- {first['reason']}" if first else \
            "no call loses more precision than its dtype explains"
        parts.append(f"<p><b>{html.escape(place(r['step'], r['rank']))}</b>: {html.escape(answer)} "
                     f"({c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['skipped']} skipped)</p>")
    shown = [call for call in summary["calls"] if call["verdict"] != "pass"]
    if shown:
        parts.append("<table><tr><th>step</th><th>rank</th><th>name</th><th>verdict</th><th>reason</th></tr>")
        for call in shown:
            cls = call["verdict"] if call["verdict"] in ("error", "warning") else ""
            cells = (call.get("step"), call.get("rank"), call["name"], call["verdict"], call["reason"])
            parts.append(f"<tr class='{cls}'>" + "".join(f"<td>{html.escape('' if v is None else str(v))}</td>"
                                                         for v in cells) + "</tr>")
        parts.append("</table>")
    parts.append(f"</section>{END}")
    return "".join(parts)


def add_to_report(path: str, summary: dict) -> bool:
    """Put the section into `path` when it exists (before its script, replacing an earlier section). True
    when written."""
    if not os.path.isfile(path) or os.path.islink(path):
        return False
    with open(path, encoding="utf-8") as f:
        page = f.read()
    start, stop = page.find(BEGIN), page.find(END)
    if start >= 0 and stop > start:
        page = page[:start] + page[stop + len(END):]
    at = page.rfind("<script>")
    if at < 0:
        at = page.rfind("</body>") if "</body>" in page else len(page)
    write_atomic(path, page[:at] + section(summary) + page[at:])
    return True
