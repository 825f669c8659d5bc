"""The C routes and the Python routes (MSPROBE_LITE_PURE_PYTHON=1) dump the same training.

The switch is read when the package is imported, so each side runs in a process of its own, with the same
program (one call site: the stacks name the same lines). The dumps agree record for record: the same names in
the same order, the same structure, dtypes, shapes and every other field, Max and Min to the bit, Mean and
Norm to 1e-6 (the C kernel and numpy/torch sum in different orders).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from helpers import c_route

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
STEPS = 2
PROGRAM = """
import json, sys
sys.path.insert(0, {tests!r})
from models import train
from msprobe_lite.core import stacks, statistics, writer
from msprobe_lite.pytorch import PrecisionDebugger, api_capture, summary
train("transformer", steps={steps}, debugger=PrecisionDebugger(dump_path={path!r}, task="statistics", level="mix"))
built = [api_capture.FastHandler, summary.FastEncoder, statistics.one_pass, writer._record_lines_c, stacks._walk_c]
print(json.dumps([route is not None for route in built]))
"""
RELATIVE = 1e-6  # Mean and Norm


def dump(path, pure: bool) -> list:
    """Trains the transformer of tests/models.py under the debugger in a new process; returns which of the
    five C routes it had (capture, encoder, kernel, writer, stack walk)."""
    env = {k: v for k, v in os.environ.items() if k != "MSPROBE_LITE_PURE_PYTHON"}
    if pure:
        env["MSPROBE_LITE_PURE_PYTHON"] = "1"
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(tests=TESTS, steps=STEPS, path=str(path))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def files(path) -> dict:
    """{relative path: parsed JSON} of a dump."""
    found = {}
    for root, _, names in os.walk(str(path)):
        for name in names:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                found[os.path.relpath(os.path.join(root, name), str(path))] = json.load(f)
    return found


def close(a, b, scale) -> bool:
    """Mean or Norm of two routes: within RELATIVE of each other, or of the tensor's scale (a mean of values
    of both signs may cancel to near zero, where its last digits are the summation order's)."""
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=RELATIVE, abs_tol=RELATIVE * scale)


def compare(c, python, where: str, wrong: list) -> None:
    """Appends to `wrong` each place where the Python route's value is not the C route's."""
    if isinstance(c, dict) and isinstance(python, dict):
        if list(c) != list(python):
            wrong.append((where, "keys", list(c), list(python)))
            return
        scale = 0.0
        for key in ("Max", "Min"):
            if isinstance(c.get(key), (int, float)) and not isinstance(c.get(key), bool) and math.isfinite(c[key]):
                scale = max(scale, abs(c[key]))
        for key in c:
            if key in ("Mean", "Norm") and "dtype" in c:
                if not close(c[key], python[key], scale):
                    wrong.append((f"{where}.{key}", c[key], python[key]))
            else:
                compare(c[key], python[key], f"{where}.{key}", wrong)
    elif isinstance(c, list) and isinstance(python, list):
        if len(c) != len(python):
            wrong.append((where, "length", len(c), len(python)))
            return
        for i, (a, b) in enumerate(zip(c, python)):
            compare(a, b, f"{where}[{i}]", wrong)
    elif isinstance(c, float) and isinstance(python, float) and math.isnan(c) and math.isnan(python):
        return
    elif type(c) is not type(python) or c != python:  # Max, Min, dtype, shape and every other field: exact
        wrong.append((where, c, python))


@c_route
def test_the_c_and_python_routes_dump_the_same_training(tmp_path):
    assert dump(tmp_path / "C", pure=False) == [True] * 5      # every C route in play
    assert dump(tmp_path / "Python", pure=True) == [False] * 5  # none
    c, python = files(tmp_path / "C"), files(tmp_path / "Python")
    assert sorted(c) == sorted(python), (sorted(c), sorted(python))
    for step in range(STEPS):
        assert f"step{step}/rank/dump.json" in c
    records = 0
    for name in sorted(c):
        if name.endswith("dump.json"):
            names = list(c[name]["data"])
            assert names == list(python[name]["data"]), name  # the same records, in the same order
            records += len(names)
            assert json.dumps(c[name]["data"]).count('"Max"') > len(names), name  # tensors in most records
        wrong = []
        compare(c[name], python[name], name, wrong)
        assert not wrong, (len(wrong), wrong[:10])
    assert records > 100
