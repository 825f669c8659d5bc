"""What was collected survives the training script raising, being terminated, and the debugger failing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import torch

from helpers import data
from models import make

from msprobe_lite.pytorch import PrecisionDebugger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = """
import sys, time, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from models import make
from msprobe_lite.pytorch import PrecisionDebugger
model, x, _ = make("mlp")
d = PrecisionDebugger(dump_path={dump!r}, level="L0", task="statistics")
d.start(model=model)
model.fc1(x)                       # one record collected, never stopped or stepped
{ending}
"""


def run_script(tmp_path, ending, wait=True):
    dump = tmp_path / "dump"
    code = SCRIPT.format(root=ROOT, tests=os.path.join(ROOT, "tests"), dump=str(dump), ending=ending)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stderr=subprocess.PIPE, text=True)
    return proc, dump


def test_uncaught_exception_keeps_collected_records(tmp_path):
    proc, dump = run_script(tmp_path, "raise RuntimeError('boom in training')")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "boom in training" in err
    assert list(data(dump)) == ["Module.fc1.Linear.forward.0"]


def test_sigterm_keeps_collected_records_and_still_terminates(tmp_path):
    proc, dump = run_script(tmp_path, "print('ready', flush=True, file=sys.stderr); time.sleep(60)")
    line = proc.stderr.readline()
    while "ready" not in line:
        line = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert list(data(dump)) == ["Module.fc1.Linear.forward.0"]


def test_dump_json_is_never_half_written(tmp_path):
    proc, dump = run_script(tmp_path, "pass")
    proc.communicate(timeout=120)
    folder = dump / "step0" / "rank"
    assert sorted(p.name for p in folder.iterdir()) == ["construct.json", "dump.json", "stack.json"]
    json.loads((folder / "dump.json").read_text())


def test_a_failing_hook_reports_once_and_training_goes_on(tmp_path, capsys, monkeypatch):
    model, x, _ = make("mlp")
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="statistics")

    def broken(*args, **kwargs):
        raise RuntimeError("summary exploded")

    # (a tensor whose statistics fail keeps its record: tests/test_reliability.py; here the hook itself fails)
    monkeypatch.setattr(d.recorder, "_encode_call", broken)  # the recorder's bound summarizer.encode_call
    d.start(model=model)
    for _ in range(3):
        out = model(x)
    out.sum().backward()
    d.stop()
    d.step()
    err = capsys.readouterr().err
    # one report per failing site, not one per module or per call
    assert err.count("internal failure in forward pre-hook") == 1
    assert err.count("internal failure in forward hook") <= 1
    assert "training continues" in err
    assert torch.isfinite(out).all()


def test_sigterm_while_a_step_is_being_written_still_terminates(tmp_path):
    code = textwrap.dedent(f"""
        import sys, time, torch
        sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        import msprobe_lite.pytorch.summary as S
        original = S.save_tensor
        def slow(t, p):
            time.sleep(0.5)
            original(t, p)
        S.save_tensor = slow
        from msprobe_lite.pytorch import PrecisionDebugger
        d = PrecisionDebugger(dump_path={str(tmp_path / 'dump')!r}, level="L1", task="tensor")
        d.start()
        for _ in range(20):
            torch.exp(torch.ones(3))
        print("writing", flush=True, file=sys.stderr)
        d.stop()                       # waits for 20+ slow file writes
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    while "writing" not in proc.stderr.readline():
        pass
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)             # before the fix: deadlock on the session lock, never exits
    assert proc.returncode == -signal.SIGTERM
