"""SIGTERM, threads and temporary files (issue 29): a user's SIGTERM handler is called as without the debugger
and the step goes on being recorded; a step trained off the main thread is written on SIGTERM; no temporary
file of the debugger outlives the process, whatever ends it, and a SIGKILL leaves what docs/reliability.md says.

Each case is a real process (signal handlers and their order are per process), several run at once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from helpers import data, expected_stats
from models import make

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = f"import sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"


def spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PATHS + textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen, word: str) -> None:
    for line in proc.stderr:
        if word in line:
            return
    raise AssertionError(f"the process ended before saying {word!r}: {proc.wait()}")


def leftovers(root) -> list:
    return sorted(f for _, _, files in os.walk(root) for f in files if ".tmp-" in f)


def every_json_is_whole(root) -> None:
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".json"):
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    json.load(fh)


# -- a user's SIGTERM handler -----------------------------------------------------------------------------------
# A graceful-shutdown loop, as real trainers have: the handler sets a flag, the loop finishes the step and
# leaves. The SIGTERM is sent from a forward hook of the user's, in the middle of the step's forward pass.
GRACEFUL = """
import os, signal, torch
from models import make, loss_of
from msprobe_lite.pytorch import PrecisionDebugger

MODE, KILL = {mode!r}, {kill!r}
stopping = []

def on_term(signum, frame):
    stopping.append(signum)

def reraise(signum, frame):           # cleans up, then dies of the signal as if unhandled
    stopping.append(signum)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)

def leave(signum, frame):
    raise SystemExit(3)

if MODE == "before":
    signal.signal(signal.SIGTERM, on_term)
elif MODE == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif MODE == "reraise":
    signal.signal(signal.SIGTERM, reraise)
elif MODE == "exit":
    signal.signal(signal.SIGTERM, leave)
d = PrecisionDebugger(dump_path={dump!r}, level="mix", task="statistics")
if MODE == "after":                   # replaces the debugger's handler
    signal.signal(signal.SIGTERM, on_term)
elif MODE == "after, chaining":       # keeps the handler it replaces, and calls it when it can
    previous = signal.getsignal(signal.SIGTERM)

    def chained(signum, frame):
        stopping.append(signum)
        if callable(previous):
            previous(signum, frame)
    signal.signal(signal.SIGTERM, chained)
print("ignored after the debugger:", signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, flush=True)

model, x, y = make("transformer")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sent = []

def hook(module, args, output):
    if KILL and not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGTERM)

model.blocks[0].attn.register_forward_hook(hook)
for step in range(2):
    d.start(model=model)
    torch.manual_seed(100 + step)
    loss = loss_of("transformer", model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    d.stop()
    d.step()
    print("loss", loss.item().hex(), flush=True)
    if stopping:
        break
print("handler calls", len(stopping), flush=True)
"""


def graceful(tmp_path, mode, kill=True):
    dump = tmp_path / mode.replace(", ", "-")
    return spawn(GRACEFUL.format(mode=mode, kill=kill, dump=str(dump))), dump


def test_a_user_sigterm_handler_is_called_and_the_step_is_recorded_whole(tmp_path):
    """Before: the debugger wrote the step at the signal and stopped recording (97 of 140 records), and a
    handler chaining to the debugger's got the process killed. Now the user's handler decides, the step is
    recorded to its end, and the dump is the one of an undisturbed step, byte for byte."""
    modes = ["before", "after", "after, chaining", "ignored"]
    undisturbed = graceful(tmp_path, "none", kill=False)
    runs = {mode: graceful(tmp_path, mode) for mode in modes}
    out, err = undisturbed[0].communicate(timeout=240)
    assert undisturbed[0].returncode == 0, err
    losses = [line for line in out.splitlines() if line.startswith("loss")]
    golden = (undisturbed[1] / "step0" / "rank" / "dump.json").read_bytes()
    assert len(json.loads(golden)["data"]) > 100
    for mode, (proc, dump) in runs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and "internal failure" not in err, (mode, err)
        lines = out.splitlines()
        if mode == "ignored":  # the debugger leaves an ignored SIGTERM ignored (children inherit it)
            assert lines[0] == "ignored after the debugger: True" and "handler calls 0" in lines, (mode, out)
            assert [line for line in lines if line.startswith("loss")] == losses, mode
        else:                  # the handler ran once; the loop finished the step and left
            assert "handler calls 1" in lines, (mode, out)
            assert [line for line in lines if line.startswith("loss")] == losses[:1], mode
            assert sorted(p.name for p in dump.iterdir()) == ["step0"], mode
        assert (dump / "step0" / "rank" / "dump.json").read_bytes() == golden, mode
        assert leftovers(dump) == [], mode


def test_a_user_handler_that_ends_the_process_finds_the_step_so_far_on_disk(tmp_path):
    """A handler that cleans up and then dies of the signal, or leaves with SystemExit: the process ends as the
    user's handler says, and what was collected up to the signal is on disk, whole, with no temporary file."""
    runs = {mode: graceful(tmp_path, mode) for mode in ("reraise", "exit")}
    for mode, (proc, dump) in runs.items():
        _, err = proc.communicate(timeout=240)
        assert "internal failure" not in err, (mode, err)
        assert proc.returncode == (-signal.SIGTERM if mode == "reraise" else 3), (mode, err)
        records = data(dump)
        assert "Module.embed.Embedding.forward.0" in records, (mode, list(records))
        assert "Module.head.Linear.forward.0" not in records, mode       # after the signal: never ran
        assert leftovers(dump) == [], mode
        every_json_is_whole(dump)


# -- training off the main thread ---------------------------------------------------------------------------------
THREADED = """
import sys, threading, time, torch
from models import make
WHERE = {where!r}
if WHERE == "picking":  # only the package on the main thread: the adapter is imported by the thread
    from msprobe_lite import PrecisionDebugger
else:
    from msprobe_lite.pytorch import PrecisionDebugger
model, x, _ = make("mlp")
made = {{}}
if WHERE == "main":
    made["d"] = PrecisionDebugger(dump_path={dump!r}, level="L0", task="statistics")

def train():
    d = made.get("d") or PrecisionDebugger(dump_path={dump!r}, level="L0", task="statistics")
    d.start(model=model)
    model(x).sum().backward()
    d.stop()
    d.step()
    d.start(model=model)
    model.fc1(x)                     # step 1: one record, then SIGTERM
    print("ready", file=sys.stderr, flush=True)
    time.sleep(60)

t = threading.Thread(target=train)
t.start()
t.join()
"""


def test_a_step_trained_off_the_main_thread_is_written_on_sigterm(tmp_path):
    """Before: a debugger made first in a helper thread could not install its SIGTERM handler (only the main
    thread may), so the step was lost and its three empty temporary files stayed."""
    runs = {}
    for where in ("thread", "main", "picking"):
        dump = tmp_path / where
        runs[where] = spawn(THREADED.format(where=where, dump=str(dump))), dump
    model, x, _ = make("mlp")
    with torch.no_grad():
        fc1 = model.fc1(x)
    for where, (proc, dump) in runs.items():
        wait_for(proc, "ready")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == -signal.SIGTERM and "internal failure" not in err, (where, err)
        assert "Module.fc2.Linear.backward.0" in data(dump, 0), where              # step 0, whole
        (record,) = data(dump, 1).values()                                         # step 1, up to SIGTERM
        assert list(data(dump, 1)) == ["Module.fc1.Linear.forward.0"], where
        stats = record["output"][0]
        assert (stats["Max"], stats["Min"]) == expected_stats(fc1)[:2], where
        assert abs(stats["Mean"] - expected_stats(fc1)[2]) < 1e-6, where
        assert leftovers(dump) == [], where
        every_json_is_whole(dump)


# -- a signal while a large step is being written -----------------------------------------------------------------
SLOW_WRITE = """
import os, signal, sys, time, torch
import msprobe_lite.core.writer as W
from msprobe_lite.pytorch import PrecisionDebugger

pieces = W.dump_json_chunks

def slowly(header, records, per=4096):     # a large step on a slow disk: the signal comes mid-write
    for n, piece in enumerate(pieces(header, records, per=50)):
        if n == 2:                         # two pieces written: the test signals, then lets the write go on
            print("writing", file=sys.stderr, flush=True)
            deadline = time.monotonic() + 60
            while not os.path.exists({dump!r} + ".go") and time.monotonic() < deadline:
                time.sleep(0.01)
        yield piece

class Preempted(Exception):
    pass

def preempted(signum, frame):              # a handler of the user's that raises the user's own exception
    raise Preempted("SIGTERM")

if {raising!r} == "before":
    signal.signal(signal.SIGTERM, preempted)
W.dump_json_chunks = slowly
d = PrecisionDebugger(dump_path={dump!r}, level="L1", task="statistics")
if {raising!r} == "after":               # replaces the debugger's handler
    signal.signal(signal.SIGTERM, preempted)
d.start()
x = torch.zeros(4)
for _ in range({calls}):
    x = torch.add(x, 1.0)
try:
    d.stop()
except Preempted:
    print("preempted", file=sys.stderr, flush=True)
    sys.exit(5)
print("written", file=sys.stderr, flush=True)
"""
CALLS = 1000


def test_sigterm_while_a_large_step_is_written_leaves_it_whole_and_no_temporary_file(tmp_path):
    """Before: the handler wrote dump.json anew inside the interrupted write and killed the process, leaving the
    interrupted write's half-written dump.json.tmp-* of several MB. Now the interrupted write finishes first,
    then the process dies of the SIGTERM; or, with a handler of the user's that raises, the user's exception
    comes out of stop(), where the signal arrived, not swallowed as a failure of the debugger's (installed
    before the debugger, or after it: start() puts the debugger's handler around it)."""
    runs = {}
    for raising in ("", "before", "after"):
        dump = tmp_path / (raising or "default")
        runs[raising] = spawn(SLOW_WRITE.format(dump=str(dump), calls=CALLS, raising=raising)), dump
    for raising, (proc, dump) in runs.items():
        wait_for(proc, "writing")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)                                  # the signal is handled, or held back, by now
        open(str(dump) + ".go", "w").close()
        _, err = proc.communicate(timeout=120)
        assert "internal failure" not in err, (raising, err)
        if raising:
            assert proc.returncode == 5 and "preempted" in err, err
        else:
            assert proc.returncode == -signal.SIGTERM, err
        records = data(dump)
        assert list(records) == [f"Torch.add.{i}.forward" for i in range(CALLS)], raising
        for i, record in records.items():
            n = int(i.split(".")[2]) + 1
            assert (record["output"][0]["Max"], record["output"][0]["Min"]) == (n, n)
        assert leftovers(dump) == [], raising
        every_json_is_whole(dump)


def test_what_a_sigkill_mid_write_leaves_is_what_the_docs_say(tmp_path):
    """docs/reliability.md, "What is not guaranteed": a SIGKILL (no handler runs) in the middle of the step's
    first write leaves that step's folder with no dump.json, only its temporary files `{name}.tmp-{pid}-{n}`
    (the one being written, part-filled, and the others, empty); compare finds no dump there. Earlier steps'
    files are whole."""
    from msprobe_lite.compare.read import _rank_dirs

    dump = tmp_path / "dump"
    proc = spawn(SLOW_WRITE.format(dump=str(dump), calls=CALLS, raising=""))
    wait_for(proc, "writing")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    folder = dump / "step0" / "rank"
    names = sorted(p.name for p in folder.iterdir())
    stems = sorted(name.split(".tmp-")[0] for name in names)
    assert stems == ["construct.json", "dump.json", "stack.json"], names
    assert all(f".tmp-{proc.pid}-" in name for name in names), names
    partial = [name for name in names if (folder / name).stat().st_size]
    assert [name.split(".tmp-")[0] for name in partial] == ["dump.json"], names
    assert _rank_dirs(str(dump / "step0")) == []


def test_a_write_that_raises_at_sigterm_or_exit_keeps_nothing_else_from_running(monkeypatch, tmp_path):
    """The write the debugger makes on SIGTERM or at exit may raise (the user's error surfacing at its read):
    the user's SIGTERM handler is called all the same, every other session still writes, the temporary files
    are still removed, and the error is raised after them."""
    import weakref

    from msprobe_lite.core import exits, writer

    class Session:
        step_open, dirty = True, True

        def __init__(self, fails):
            self.fails, self.wrote = fails, []

        def write(self, how):
            self.wrote.append(how)
            if self.fails:
                raise RuntimeError("CUDA error: device-side assert triggered")

        def write_so_far(self):
            self.write("so far")

        def write_on_exit(self):
            self.write("exit")

    sessions = [Session(True), Session(False)]
    live = weakref.WeakSet(sessions)
    monkeypatch.setattr(exits, "_live", live)
    leftover = tmp_path / "dump.json.tmp-1"
    leftover.write_text("{")
    monkeypatch.setattr(writer, "_temporary", {str(leftover)})
    called = []
    with pytest.raises(RuntimeError, match="device-side assert"):
        exits._Handler(lambda signum, frame: called.append(signum)).handle(signal.SIGTERM, None)
    assert called == [signal.SIGTERM] and [s.wrote for s in sessions] == [["so far"], ["so far"]]
    with pytest.raises(RuntimeError, match="device-side assert"):
        exits.flush_all()
    assert [s.wrote for s in sessions] == [["so far", "exit"], ["so far", "exit"]] and not leftover.exists()


def test_a_users_handler_raising_at_the_end_of_a_step_leaves_the_debugger_between_two_steps(tmp_path, monkeypatch):
    """SIGTERM arrives while step() writes; the user's handler raises (it is called once the write is whole).
    The exception reaches the user from step(), and the debugger has moved on: the user who catches it and
    trains on gets the next step recorded as step 1, numbered from 0, step 0 whole."""
    from msprobe_lite.core import writer
    from msprobe_lite.pytorch import PrecisionDebugger

    class Shutdown(Exception):
        pass

    def users_handler(signum, frame):
        raise Shutdown()

    original = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, users_handler)
    try:
        model, x, _ = make("mlp")
        debugger = PrecisionDebugger(dump_path=str(tmp_path / "run"), task="statistics", level="L0")
        write_step = writer.write_step
        signalled = []

        def write_then_signal(*args, **kwargs):
            if not signalled:
                signalled.append(os.kill(os.getpid(), signal.SIGTERM))  # mid-write: held until the step's end
            return write_step(*args, **kwargs)

        monkeypatch.setattr(writer, "write_step", write_then_signal)
        for step in range(2):
            debugger.start(model=model)
            model(x).sum().backward()
            if step:  # step 0 goes straight to step(): its write is the one the signal comes in
                debugger.stop()
            try:
                debugger.step()
            except Shutdown:
                assert step == 0
        assert signalled and list(data(tmp_path / "run", 1)) == list(data(tmp_path / "run", 0))
        assert "Module.fc1.Linear.forward.0" in data(tmp_path / "run", 1)
    finally:
        signal.signal(signal.SIGTERM, original)
