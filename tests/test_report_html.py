"""report.html in a real browser (issue 33): headless Chromium opens it, runs its script without errors, shows
the first divergence, opens a tree node (the page's own `#selftest`), and takes a screenshot kept under the
test's output. tools/test.sh installs Debian's chromium where it is missing."""
from __future__ import annotations

import shutil
import subprocess

import torch
import torch.nn as nn
from helpers import classifier_steps

from msprobe_lite.compare import compare


class Blocks(nn.Module):
    def __init__(self, eps):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16))
        self.head = nn.Sequential(nn.LayerNorm(16, eps=eps), nn.Linear(16, 4))

    def forward(self, x):
        return self.head(self.encoder(x))


def train(path, eps):
    torch.manual_seed(0)  # the target's LayerNorm epsilon: another setting
    classifier_steps(path, "mix", Blocks(eps), lambda p: torch.optim.SGD(p, lr=0.1), optimizer_in_window=False)


def browser(*args):
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "no chromium: tools/test.sh installs Debian's chromium package"
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000",
                           *args], capture_output=True, text=True, timeout=120)


def test_report_html_opens_on_the_first_divergence_in_a_headless_browser(tmp_path):
    train(tmp_path / "target", 1e-1)
    train(tmp_path / "golden", 1e-5)
    summary = compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"), quiet=True)
    first = summary.pairs[0]["first_divergence"]
    assert first is not None
    page = (tmp_path / "out" / "report.html").resolve()
    text = page.read_text()
    assert "http://" not in text and "https://" not in text and "<script src" not in text  # self-contained
    dom = browser("--dump-dom", "--window-size=1280,1000", f"{page.as_uri()}#selftest")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-ready="1"' in html and 'data-errors=""' in html, html[:500]
    assert 'data-expanded="1"' in html  # a closed tree node opened when its summary was clicked
    assert 'data-sideways="0"' in html  # both runs' tensors side by side fit a 1280-pixel window
    shown = html.split("class=\"step shown\"", 1)[1].split("</section>", 1)[0]
    assert "<h3>First divergence</h3>" in shown and first["name"] in shown
    assert "calls in execution order" in shown and "first divergence</text>" in shown  # the plot's axes, mark
    assert "<details data-name=\"Module.head.Sequential.forward.0\" open" in shown  # the path to it is open
    assert "pass (no difference of its own)" in shown  # a module carrying in its inputs' difference says so
    shot = tmp_path / "report.png"
    result = browser(f"--screenshot={shot}", "--window-size=1280,1000", page.as_uri())
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]


def test_the_error_plot_of_many_calls_keeps_each_pixels_largest_error():
    """100k calls on a 920-pixel axis: at most two points a pixel, each pixel's largest error, so one call that
    departs among thousands that agree is still drawn as a peak (and the page stays small)."""
    from msprobe_lite.compare.html_report import _peaks

    errors = [1e-7] * 100_000
    errors[61_234] = 0.5
    errors[99_999] = float("nan")
    points = _peaks(errors, 920)
    assert len(points) <= 2 * 920
    assert (61_234, 0.5) in points and any(i == 99_999 for i, _ in points)
    assert _peaks(errors[:1000], 920) == list(enumerate(errors[:1000]))
