"""report.html: the place a person goes to look (issue 33). One self-contained file (inline CSS, JS and SVG, no
network): a section per step and rank, switched by a menu, opening on the first one with a divergence; in
each, the answer, the calls it names with both runs' tensors side by side, the error along execution order
(labelled axes, the first divergence marked) and the module tree coloured by each module's worst error, the
path to the first divergence open, searchable by name. The page records its own script errors in
`data-errors` and, opened with `#selftest`, opens a closed tree node by itself and says in `data-sideways` whether
the window must scroll sideways (tests/test_report_html.py reads them in headless Chromium).
"""
from __future__ import annotations

import html
import math

from ..core.writer import write_atomic
from .read import place
from .console import block
from .report import across_ranks_line, users_frame

CALL_COLUMNS = ("NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
                "NPU max", "Bench max", "NPU min", "Bench min", "NPU mean", "Bench mean", "NPU l2norm",
                "Bench l2norm", "MaxRelativeErr", "NormRelativeErr", "Result")  # the reason is above the table
_FOUND = (("first_divergence", "First divergence"), ("first_only_in_target", "Call only in the target"),
          ("first_only_in_golden", "Call only in the golden (the target does not make it)"),
          ("first_error", "First error (no call introduced one)"),
          ("first_seen", "First call whose inputs differ (no call introduced a divergence)"),
          ("first_warning", "First warning (no call introduced a divergence)"))
_STYLE = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}td,th{border:1px solid #ccc;padding:2px 6px;
font-size:13px}table{border-collapse:collapse;margin-bottom:1em}.error{background:#fcc}.warning{background:#ffe9a8}
.step{display:none}.step.shown{display:block}details{margin-left:1.2em}summary{cursor:pointer}
.answer{white-space:pre-wrap;background:#f6f6f6;padding:.6em;font-family:monospace;font-size:13px}
.named{font-weight:bold;outline:2px solid #c0392b}.hidden{display:none}.golden{color:#555}
.legend{font-size:12px;color:#555}table.tensors td{white-space:nowrap}"""
_SCRIPT = """
document.body.dataset.errors = "";
window.addEventListener("error", e => { document.body.dataset.errors += (e.message || "error") + ";"; });
function show(id) {
  document.querySelectorAll(".step").forEach(s => s.classList.toggle("shown", s.id === id));
}
document.getElementById("steps").addEventListener("change", e => show(e.target.value));
document.querySelectorAll(".search").forEach(box => box.addEventListener("input", () => {
  const text = box.value.toLowerCase(), tree = box.nextElementSibling;
  tree.querySelectorAll("details").forEach(d => {
    const hit = !text || d.dataset.name.toLowerCase().includes(text);
    d.classList.toggle("hidden", !hit && !d.querySelector("details:not(.hidden)"));
    if (text && hit) { for (let p = d.parentElement; p && p.tagName === "DETAILS"; p = p.parentElement) p.open = true; }
  });
}));
show(document.getElementById("steps").value);
if (location.hash === "#selftest") {
  const closed = document.querySelector(".step.shown details:not([open]) > summary");
  if (closed) { closed.click(); document.body.dataset.expanded = closed.parentElement.open ? "1" : "0"; }
  document.body.dataset.sideways = document.documentElement.scrollWidth > window.innerWidth ? "1" : "0";
}
document.body.dataset.ready = "1";
"""


def write_html(path: str, summary: dict, details: list) -> None:
    """details: per step/rank pair, compare's details (api._compare_one): the pair, the errors along execution
    order, the modules' worst errors and tree, the rows of the calls named."""
    sections, options = [], []
    opening = next((i for i, d in enumerate(details) if d["pair"]["first_divergence"]), 0)
    for i, d in enumerate(details):
        p = d["pair"]
        where = place(p["step"], p["rank"])
        options.append(f"<option value='s{i}'{' selected' if i == opening else ''}>{html.escape(where)}"
                       f"{' - divergence' if p['first_divergence'] else ''}</option>")
        sections.append(f"<section class='step' id='s{i}'>{_section(where, d)}</section>")
    across = "".join(f"<p>{html.escape(across_ranks_line(v))}</p>" for v in summary.get("across_ranks") or [])
    page = ["<!doctype html><html lang='en'><meta charset='utf-8'><title>msprobe_lite compare</title>",
            f"<style>{_STYLE}</style><body>",
            f"<h1>Compare report ({html.escape(summary['mode'])} mode)</h1>",
            f"<p>Step and rank: <select id='steps'>{''.join(options)}</select></p>",
            f"<h2>Across ranks</h2>{across}" if across else "", *sections, f"<script>{_SCRIPT}</script></body></html>"]
    write_atomic(path, "\n".join(page))


def _section(where: str, d: dict) -> str:
    p = d["pair"]
    # the console's verdict block; the whole reasoning is in the tables below
    parts = [f"<h2>{html.escape(where)}</h2><div class='answer'>{html.escape(block(p))}</div>"]
    shown = set()  # a call named twice (first seen and first warning) is shown once, under its first heading
    for key, heading in _FOUND:
        found = p.get(key)
        if found and found["name"] not in shown and \
                not (key in ("first_error", "first_seen", "first_warning") and p["first_divergence"]):
            shown.add(found["name"])
            parts.append(_found(heading, found, d.get("rows", {}).get(found["name"])))
    parts.append("<h3>Output error along execution order</h3>" + _plot(d["errors"], d.get("first_at")))
    if d["modules"]:
        named = (p["first_divergence"] or {}).get("name")
        parts.append("<h3>Modules, coloured by the worst output error of their calls</h3><p class='legend'>"
                     "green: equal; yellow to red: 1e-7 to 100% of their magnitude. A module that passes "
                     "took its difference in with its inputs; an error or warning made one of its own.</p>"
                     "<input class='search' placeholder='search a module by name' size='50'>"
                     f"<div class='tree'>{_tree(d['modules'], d.get('tree') or {}, named, p)}</div>")
    return "".join(parts)


def _found(heading: str, found: dict, rows) -> str:
    """A named call: name, golden partner, reason, parents, stack, and both runs' tensors side by side."""
    out = [f"<h3>{html.escape(heading)}</h3><table>"]
    for key in ("name", "golden_name", "reason"):
        if found.get(key):
            out.append(f"<tr><th>{key}</th><td>{html.escape(str(found[key]))}</td></tr>")
    parents = " &lt; ".join(html.escape(x) for x in found.get("parents") or []) or "-"
    frames = found.get("stack") or []
    line = users_frame(frames) or "-"
    stack = "<br>".join(html.escape(f) for f in frames)
    out.append(f"<tr><th>parents</th><td>{parents}</td></tr><tr><th>source</th><td><code>{html.escape(line)}</code>"
               f"<details><summary>the whole stack ({len(frames)} frames)</summary><code>{stack}</code></details>"
               "</td></tr></table>")
    if rows:
        out.append(_tensors(found["name"], rows))
    return "".join(out)


# the call table's columns: (heading, the target's column, the golden's): each cell holds the target's value
# over the golden's, so that both runs sit side by side in a table that fits a 1280-pixel window
_SIDE_BY_SIDE = (("dtype", "NPU Dtype", "Bench Dtype"), ("shape", "NPU Tensor Shape", "Bench Tensor Shape"),
                 ("max", "NPU max", "Bench max"), ("min", "NPU min", "Bench min"),
                 ("mean", "NPU mean", "Bench mean"), ("L2 norm", "NPU l2norm", "Bench l2norm"))


def _tensors(call: str, rows: list) -> str:
    """Both runs' tensors of a call: a row per tensor named after the call (`input.0`), the golden's name
    only where it differs."""
    head = "".join(f"<th>{h}</th>" for h in ("tensor", *(c[0] for c in _SIDE_BY_SIDE), "max rel. err",
                                                  "norm rel. err", "result"))
    out = [f"<table class='tensors'><tr>{head}</tr>"]
    for row in rows:
        cls = row.get("Result") if row.get("Result") in ("error", "warning") and _differs(row) else ""
        name, bench = _within(call, row.get("NPU Name")), _within(call, row.get("Bench Name"))
        label = html.escape(name or bench) + (f"<br><small>golden: {html.escape(bench)}</small>"
                                              if name and bench and bench != name else "")
        cells = [f"<td>{html.escape(_cell(row.get(t)))}<br><span class='golden'>{html.escape(_cell(row.get(g)))}"
                 f"</span></td>" for _, t, g in _SIDE_BY_SIDE]
        cells += [f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in ("MaxRelativeErr", "NormRelativeErr", "Result")]
        out.append(f"<tr class='{cls}'><td>{label}</td>{''.join(cells)}</tr>")
    out.append("</table><p class='legend'>each cell: the target's value over <span class='golden'>the golden's"
               "</span></p>")
    return "".join(out)


def _differs(row: dict) -> bool:
    """Whether a row itself differs: its relative errors, or its values where it has none. A row takes its
    call's result (the table's format); the colour marks only the rows that differ (the inputs that agree with
    a call that erred stay white)."""
    errors = [row.get(c) for c in ("MaxRelativeErr", "NormRelativeErr") if isinstance(row.get(c), (int, float))]
    if errors:
        return any(e != 0 for e in errors)
    return row.get("NPU max") != row.get("Bench max") or row.get("NPU Dtype") != row.get("Bench Dtype")


def _within(call: str, name) -> str:
    """A row's name after its call's (`input.0` of `Functional.linear.0.forward.input.0`)."""
    if not name:
        return ""
    return name[len(call) + 1:] if name.startswith(call + ".") else name


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _colour(err: float) -> str:
    """Green (agrees) through yellow to red (differs by its whole magnitude or more), on a log scale."""
    if not err or err != err:
        return "#dff0d8"
    level = 1.0 if math.isinf(err) else min(max((math.log10(err) + 7) / 7, 0.0), 1.0)
    return f"hsl({int(120 * (1 - level))},70%,80%)"


def _tree(modules: dict, parents: dict, named, pair) -> str:
    """The modules as nested <details>, the path to the named call open."""
    children: dict = {}
    for module in modules:
        parent = parents.get(module)
        children.setdefault(parent if parent in modules else None, []).append(module)
    path = set((pair["first_divergence"] or {}).get("parents") or []) | ({named} if named else set())

    def node(module) -> str:
        worst, result = modules[module]
        inner = "".join(node(c) for c in children.get(module, []))
        mark = " class='named'" if module == named else ""
        return (f"<details data-name='{html.escape(module)}'{' open' if module in path else ''}>"
                f"<summary style='background:{_colour(worst)}'{mark}>{html.escape(module)} - {_label(worst, result)}"
                f"</summary>{inner}</details>")
    return "".join(node(m) for m in children.get(None, []))


def _label(worst: float, result: str) -> str:
    """A tree node's words: its colour is the size of its outputs' difference, which a module that passes
    may still carry in from its inputs; the words say which."""
    if result != "pass":
        return f"{result}, worst output error {worst:.3g}"
    return "pass, outputs equal" if not worst else f"pass (no difference of its own), worst output error {worst:.3g}"


def _peaks(errors: list, pixels: int) -> list:
    """(index, error) to draw: every call, or where there are more calls than two per pixel, the largest error
    of each pixel's calls (a divergence among thousands of agreeing calls stays a peak)."""
    if len(errors) <= 2 * pixels:
        return list(enumerate(errors))
    best: dict = {}
    per = len(errors) / pixels
    for i, e in enumerate(errors):
        at = int(i / per)
        if at not in best or _above(e, errors[best[at]]):
            best[at] = i
    return [(i, errors[i]) for i in best.values()]


def _above(a: float, b: float) -> bool:
    return a > b or (a != a and b == b)  # NaN drawn as an infinite error is a peak too


def _plot(errors: list, first_at, width: int = 1000, height: int = 220) -> str:
    """Output relative error (log10) of every paired call along execution order, axes labelled, the first
    divergence marked."""
    if not errors:
        return "<p>no paired calls</p>"
    finite = [e for e in errors if e > 0 and math.isfinite(e)]
    low = math.floor(math.log10(min(finite))) if finite else -8
    high = math.ceil(math.log10(max(finite))) if finite else 0
    span = max(high - low, 1)
    left, bottom = 60, height - 40

    def x(i):
        return left + i * (width - left - 20) / max(len(errors) - 1, 1)

    def y(e):
        level = high if math.isinf(e) else (low if e <= 0 else math.log10(e))
        return bottom - (level - low) / span * (bottom - 20)
    points = " ".join(f"{x(i):.1f},{y(e):.1f}" for i, e in _peaks(errors, width - left - 20))
    marks = "".join(f'<text x="{left - 8}" y="{y(10.0 ** v) + 4:.1f}" font-size="11" text-anchor="end">1e{v}</text>'
                    for v in range(low, high + 1))
    first = "" if first_at is None else (
        f'<line x1="{x(first_at):.1f}" x2="{x(first_at):.1f}" y1="20" y2="{bottom}" stroke="#2c3e50" '
        f'stroke-dasharray="4"/><text x="{x(first_at) + 4:.1f}" y="30" font-size="11">first divergence</text>')
    return (f'<svg width="{width}" height="{height}" style="border:1px solid #ccc">{marks}'
            f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#888"/>'
            f'<line x1="{left}" y1="20" x2="{left}" y2="{bottom}" stroke="#888"/>'
            f'<text x="{(width + left) / 2:.0f}" y="{height - 8}" font-size="12" text-anchor="middle">'
            f'calls in execution order (1 to {len(errors)})</text>'
            f'<text x="14" y="{bottom / 2:.0f}" font-size="12" transform="rotate(-90 14 {bottom / 2:.0f})" '
            f'text-anchor="middle">output error</text>'
            f'<polyline fill="none" stroke="#c0392b" stroke-width="1.2" points="{points}"/>{first}</svg>')

