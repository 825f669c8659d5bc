"""The debugger survives what real training throws at it (issue 8): a full disk, a lost permission, its folder
deleted, crashes and SIGTERM mid-forward and mid-backward, exotic values, other threads, forked workers.

Each fault: training goes on with the same numbers (or dies only of its own cause), the debugger reports once
with the cause, and what was collected before the fault is on disk, whole.
"""
from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from helpers import C_ROUTES, ROUTE_PARAMS, c_route, data, load
from models import make, train

from msprobe_lite.core import exits, safety, session as session_module
from msprobe_lite.pytorch import PrecisionDebugger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="finds files by descriptor")


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    """Failures are reported once per process: each test starts with none reported yet."""
    monkeypatch.setattr(safety, "_seen", {})


def run_step(d, model, x):
    d.start(model=model)
    model(x).sum().backward()
    d.stop()
    d.step()


def leftovers(root):
    """Temporary files of the writer still lying around (a write that failed half-way and was not undone)."""
    return [f for _, _, files in os.walk(root) for f in files if ".tmp-" in f]


def every_dump_json_is_whole(root):
    for folder, _, files in os.walk(root):
        for f in files:
            if f.endswith(".json"):
                with open(os.path.join(folder, f), encoding="utf-8") as fh:
                    json.load(fh)


@contextlib.contextmanager
def failing(monkeypatch, under, code, calls=("write",)):
    """OSError(code) from the os-level calls named in `calls` when they touch a path under `under`."""
    under = str(under)
    real = {name: getattr(os, name) for name in calls}

    def is_ours(arg):
        if isinstance(arg, int):
            try:
                arg = os.readlink(f"/proc/self/fd/{arg}")
            except OSError:
                return False
        return isinstance(arg, (str, os.PathLike)) and os.fspath(arg).startswith(under)

    def make(name):
        def fake(target, *args, **kwargs):
            if is_ours(target):
                raise OSError(code, os.strerror(code), None if isinstance(target, int) else target)
            return real[name](target, *args, **kwargs)
        return fake

    for name in calls:
        monkeypatch.setattr(os, name, make(name))
    try:
        yield
    finally:
        for name in calls:
            monkeypatch.setattr(os, name, real[name])


# -- disk full, permission lost --------------------------------------------------------------------------------
@needs_proc
@pytest.mark.parametrize("code, calls", [(errno.ENOSPC, ("write",)), (errno.EACCES, ("open", "mkdir"))],
                         ids=["ENOSPC", "EACCES"])
def test_a_failing_disk_mid_step_keeps_what_was_written(tmp_path, monkeypatch, capsys, code, calls):
    model, x, _ = make("mlp")
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="statistics")
    run_step(d, model, x)                                  # step 0: written whole
    d.start(model=model)
    out = model(x)
    d.stop()                                               # step 1: forward records written
    forward_only = data(tmp_path, 1)
    with failing(monkeypatch, tmp_path, code, calls):
        out.sum().backward()
        d.step()                                           # step 1 with its backward records: fails
        run_step(d, model, x)                              # step 2: fails again, not reported again
    run_step(d, model, x)                                  # step 3: the disk is back

    err = capsys.readouterr().err
    # the file system's refusal is said plainly, once, without a traceback: not an internal failure
    assert err.count("cannot write") == 1 and "internal failure" not in err and "Traceback" not in err, err
    assert os.strerror(code) in err and "training continues" in err
    assert data(tmp_path, 1) == forward_only               # the earlier file, whole, not half of the new one
    assert not (tmp_path / "step2" / "rank" / "dump.json").exists()
    assert data(tmp_path, 3).keys() == data(tmp_path, 0).keys()
    assert any(".backward." in name for name in data(tmp_path, 3))
    assert leftovers(tmp_path) == []
    every_dump_json_is_whole(tmp_path)


def test_a_tensor_folder_that_cannot_be_made_is_said_plainly(tmp_path, capsys):
    """The tensor task's folder is made at the first saved tensor: a refusal there was an internal failure
    with a traceback (a review). The records keep their statistics."""
    model, x, _ = make("mlp")
    blocker = tmp_path / "step0" / "rank" / "dump_tensor_data"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the folder goes")
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="tensor")
    run_step(d, model, x)
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1 and "internal failure" not in err and "Traceback" not in err, err
    assert data(tmp_path)["Module.fc1.Linear.forward.0"]["output"][0]["Max"] is not None


@needs_proc
def test_a_full_disk_never_changes_the_numbers_of_training(tmp_path, monkeypatch):
    want = train("mlp", steps=3)
    d = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="tensor")
    with failing(monkeypatch, tmp_path, errno.ENOSPC):
        got = train("mlp", steps=3, debugger=d)
    for a, b in zip(want, got):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    d.session.files.wait()
    assert leftovers(tmp_path) == []


@needs_proc
def test_tensor_files_failing_on_the_writer_thread_report_once(tmp_path, monkeypatch, capsys):
    model, x, _ = make("mlp")
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L0", task="tensor")
    with failing(monkeypatch, tmp_path / "step0" / "rank" / "dump_tensor_data", errno.ENOSPC):
        run_step(d, model, x)
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1 and "No space left on device" in err and "internal failure" not in err
    assert "Module.fc1.Linear.forward.0" in data(tmp_path)   # dump.json itself was written
    assert leftovers(tmp_path) == []


def test_dump_folder_deleted_while_running(tmp_path, capsys):
    dump = tmp_path / "dump"
    model, x, _ = make("mlp")
    d = PrecisionDebugger(dump_path=str(dump), level="L0", task="tensor")
    run_step(d, model, x)
    d.start(model=model)
    model.fc1(x)
    d.session.files.wait()
    shutil.rmtree(dump)                                    # e.g. a clean-up script, mid-step
    model(x).sum().backward()
    d.stop()
    d.step()
    run_step(d, model, x)
    records = data(dump, 1)
    assert "Module.fc2.Linear.backward.0" in records      # the step's later records are all there
    folder = load(dump, 1)["dump_data_dir"]
    # files written after the deletion exist: the folder was made again, not reported as lost
    assert os.path.isfile(os.path.join(folder, records["Module.fc2.Linear.forward.0"]["output"][0]["data_name"]))
    assert "Module.fc2.Linear.backward.0" in data(dump, 2)
    assert "internal failure in writing" not in capsys.readouterr().err
    every_dump_json_is_whole(dump)


# -- crashes and SIGTERM mid-forward and mid-backward ----------------------------------------------------------
CRASH_SCRIPT = """
import os, sys, time, torch
sys.path.insert(0, {root!r})
from msprobe_lite.pytorch import PrecisionDebugger

class Fault(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()
    @staticmethod
    def backward(ctx, g):
        {in_backward}
        return g

class Inner(torch.nn.Module):
    def forward(self, x):
        {in_forward}
        return x

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 4)
        self.inner = Inner()
        self.fc2 = torch.nn.Linear(4, 4)
    def forward(self, x):
        x = self.fc1(x)                     # recorded before the fault
        x = Fault.apply(self.inner(x))
        return self.fc2(x)

torch.manual_seed(0)
net = Net()
d = PrecisionDebugger(dump_path={dump!r}, level="mix", task="statistics")
d.start(model=net)
net(torch.ones(2, 4)).sum().backward()
d.stop()
d.step()
"""
WAIT = "print('ready', file=sys.stderr, flush=True); time.sleep(60)"
CRASHES = {  # name: (code in Inner.forward, code in Fault.backward)
    "exception mid-forward": ("raise RuntimeError('user bug in forward')", "pass"),
    "exception mid-backward": ("pass", "raise RuntimeError('user bug in backward')"),
    "SIGTERM mid-forward": (WAIT, "pass"),
    "SIGTERM mid-backward": ("pass", WAIT),
}


def test_crashes_mid_forward_and_mid_backward_keep_what_was_collected(tmp_path):
    procs = {}
    for i, (name, (in_forward, in_backward)) in enumerate(CRASHES.items()):
        code = CRASH_SCRIPT.format(root=ROOT, dump=str(tmp_path / str(i)), in_forward=in_forward,
                                   in_backward=in_backward)
        procs[name] = (subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stderr=subprocess.PIPE,
                                        text=True), tmp_path / str(i))
    for name, (proc, _) in procs.items():               # all four run at once: the test takes one start-up
        if name.startswith("SIGTERM"):
            for line in proc.stderr:
                if "ready" in line:
                    break
            proc.send_signal(signal.SIGTERM)
    for name, (proc, dump) in procs.items():
        err = proc.communicate(timeout=120)[1]
        assert "internal failure" not in err, (name, err)
        if name.startswith("SIGTERM"):
            assert proc.returncode == -signal.SIGTERM, (name, err)
        else:
            assert proc.returncode == 1 and "user bug in" in err, (name, err)   # the user's error, as is
        records = data(dump)
        assert "Module.fc1.Linear.forward.0" in records and "Functional.linear.0.forward" in records, name
        assert records["Module.fc1.Linear.forward.0"]["output"], name
        if name.endswith("mid-backward"):
            # fc2's backward ran before the fault; fc1's (after it) never did
            assert "Module.fc2.Linear.backward.0" in records, (name, list(records))
            assert "Module.fc1.Linear.backward.0" not in records, name
        else:
            assert "Module.fc2.Linear.forward.0" not in records, name
        assert leftovers(dump) == []
        every_dump_json_is_whole(dump)


# -- exotic values ------------------------------------------------------------------------------------------------
class Passes(torch.nn.Module):
    """Takes anything and returns its first argument, so every value meets both the forward hooks."""

    def forward(self, value, *rest):
        return value


class Root(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = Passes()

    def forward(self, *args):
        return self.p(*args)


class Plain(torch.Tensor):
    pass


def exotic_values():
    from torch.testing._internal.two_tensor import TwoTensor

    return {
        "subclass": torch.ones(3).as_subclass(Plain),
        "wrapper subclass": TwoTensor(torch.ones(3), torch.ones(3)),
        "meta": torch.empty(3, device="meta"),
        "sparse": torch.eye(3).to_sparse(),
        "sparse csr": torch.eye(3).to_sparse_csr(),
        "quantized": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.quint8),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "uint16": torch.ones(3, dtype=torch.uint16),
        "torch.Generator": torch.Generator(),
    }


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_exotic_values_keep_their_record_and_report_once(tmp_path, capsys, task):
    values = exotic_values()
    model = Root()
    d = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task=task)
    d.start(model=model)
    for value in values.values():
        model(value)
        model(value)
    d.stop()
    d.step()
    records = data(tmp_path)
    for i, name in enumerate(values):
        for n in (2 * i, 2 * i + 1):
            record = records[f"Module.p.Passes.forward.{n}"]  # every call kept, numbering intact
            assert record["input_args"] and "output" in record, name
    reports = [line for line in capsys.readouterr().err.splitlines() if "internal failure" in line]
    assert 0 < len(reports) <= len(values)             # each value met twice, each cause told once
    assert len({r.split(" -- ")[0] for r in reports}) == len(reports), reports
    assert not any("failure in forward" in r for r in reports)   # no hook lost its record
    every_dump_json_is_whole(tmp_path)


def test_a_generator_argument_is_neither_consumed_nor_a_failure(tmp_path, capsys):
    model = Root()
    d = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="statistics")
    d.start(model=model)
    gen = (torch.full((2,), float(i)) for i in range(3))
    out = model(torch.ones(2), gen)
    assert [t[0].item() for t in gen] == [0.0, 1.0, 2.0]   # the user's generator still yields everything
    torch.cat([out, out])
    d.stop()
    d.step()
    assert "Module.p.Passes.forward.0" in data(tmp_path)
    assert "internal failure" not in capsys.readouterr().err


# -- threads ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_other_threads_never_enter_the_main_threads_records(tmp_path, level):
    def steps(dump, busy):
        model, x, _ = make("mlp")
        d = PrecisionDebugger(dump_path=str(dump), level=level, task="statistics")
        stop = threading.Event()

        def loader():        # a data-loading thread: torch calls, and the same model, while the main dumps
            while not stop.is_set():
                torch.exp(torch.ones(4))
                with torch.no_grad():
                    model(x)

        thread = threading.Thread(target=loader, daemon=True)
        if busy:
            thread.start()
        for _ in range(3):
            run_step(d, model, x)
        stop.set()
        if busy:
            thread.join()
        return [json.dumps(data(dump, s), sort_keys=True) for s in range(3)]

    assert steps(tmp_path / "busy", True) == steps(tmp_path / "alone", False)


def test_a_step_folder_is_made_ahead_and_gone_when_nothing_was_written(tmp_path):
    """start() has the step's folder and temporary files made on the writer thread (slow on some file
    systems); the write fills them; a step that records nothing leaves nothing behind, at step() or at exit."""
    config, tmp_path = tmp_path / "config.json", tmp_path / "dump"
    config.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path),
                                  "statistics": {"list": ["Torch.exp"]}}))
    d = PrecisionDebugger(str(config))
    d.start()
    d.session.files.wait()
    assert (tmp_path / "step0" / "rank").is_dir()       # made ahead, while the step runs
    torch.cos(torch.ones(2))                            # not in the list: nothing recorded
    d.stop()
    d.step()
    assert not (tmp_path / "step0").exists()            # its temporary files and folders are gone
    d.start()
    torch.exp(torch.ones(2))
    d.stop()
    d.step()
    assert list(data(tmp_path, 1)) == ["Torch.exp.0.forward"]
    assert sorted(p.name for p in (tmp_path / "step1" / "rank").iterdir()) == [
        "construct.json", "dump.json", "stack.json"]    # written through the files opened ahead
    d.start()                                           # the process ends in a step that recorded nothing
    exits.flush_all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step1"]
    d.stop()                                            # (the process goes on here: capture off again)


def test_what_is_made_ahead_is_removed_only_when_it_was_ours(tmp_path, monkeypatch):
    """An empty step folder that existed before (the user's, an earlier run's) stays; a link planted at a
    temporary name made ahead is removed, never written through; a flush held by another thread makes the
    exit path give up instead of racing it."""
    from msprobe_lite.compare.read import _rank_dirs

    (tmp_path / "step0").mkdir()
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    d.start()
    d.session.files.wait()
    d.stop()
    d.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0"] and not list((tmp_path / "step0").iterdir())

    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    d.start()
    d.session.files.wait()
    (tmp,) = [p for p in (tmp_path / "step1" / "rank").iterdir() if p.name.startswith("dump.json.tmp-")]
    tmp.unlink()
    tmp.symlink_to(victim)                              # planted at the name made ahead
    torch.exp(torch.ones(2))
    d.stop()
    d.step()
    assert victim.read_text() == "keep" and list(data(tmp_path, 1)) == ["Torch.exp.0.forward"]
    assert sorted(p.name for p in (tmp_path / "step1" / "rank").iterdir()) == [
        "construct.json", "dump.json", "stack.json"]

    d.start()
    torch.exp(torch.ones(2))
    held, release = threading.Event(), threading.Event()

    def hold():
        with d.session._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    monkeypatch.setattr(session_module, "EXIT_WAIT_S", 0.2)
    exits.flush_all()                                   # waits EXIT_WAIT_S, then gives up: another thread writes
    release.set()
    holder.join()
    d.stop()
    d.step()
    assert list(data(tmp_path, 2)) == ["Torch.exp.0.forward"]
    assert _rank_dirs(str(tmp_path / "step9")) == []    # a step folder removed while compare lists it


def test_the_file_queue_lets_a_signal_handler_wait_inside_submit():
    """SIGTERM may interrupt the training thread inside FileQueue.submit(), holding its lock, and the
    handler then waits for the queue: that must finish, not deadlock."""
    from msprobe_lite.core.writer import FileQueue

    queue, done = FileQueue(), []

    def interrupted_submit():
        queue.submit(lambda: done.append(1), "first")
        with queue._changed:                             # inside submit(), lock held: the handler runs
            queue._jobs.append((lambda: done.append(2), "queued, not yet counted"))
            queue._changed.notify_all()
            queue.wait()                                 # what the handler does
            finished.set()
            queue._pending += 1                          # submit() goes on after the handler
        queue.wait()

    finished = threading.Event()
    thread = threading.Thread(target=interrupted_submit, daemon=True)
    thread.start()
    assert finished.wait(10), "the handler's wait deadlocked"
    thread.join(10)
    assert done == [1, 2]


# -- forked workers -----------------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_never_records_or_writes(tmp_path):
    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    d.start()
    torch.exp(torch.ones(2))
    pid = os.fork()
    if pid == 0:  # the child: records nothing, writes nothing, even when stopped, stepped or terminated
        try:
            torch.sinh(torch.ones(2))
            d.stop()
            d.step()
            exits.flush_all()
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    # nothing from the child (the parent has made the step's folder and temporary files ahead)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and f".tmp-{os.getpid()}-" not in p.name]
    torch.cos(torch.ones(2))
    d.stop()
    d.step()
    assert list(data(tmp_path)) == ["Torch.exp.0.forward", "Torch.cos.0.forward"]


class TorchDataset(torch.utils.data.Dataset):
    """Calls a torch API in the worker, and tells what the worker's inherited session holds."""

    debugger = None

    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.sinh(torch.full((8,), float(i)))
        session = self.debugger.session
        return x, torch.tensor([len(session.records), session.forward_on, session.step_open, os.getpid()])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_dataloader_workers_record_nothing_and_write_no_dumps(tmp_path):
    model, _, _ = make("mlp")
    d = TorchDataset.debugger = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="statistics",
                                                  step=[0, 1])
    workers = set()
    for step in range(2):
        d.start(model=model)                               # the workers fork while collecting
        loader = torch.utils.data.DataLoader(TorchDataset(), batch_size=4, num_workers=2,
                                             multiprocessing_context="fork")
        for x, state in loader:
            assert state[:, :3].sum() == 0                 # in a worker: no records, not collecting
            workers |= set(state[:, 3].tolist())
            model(x).sum().backward()
        del loader
        d.stop()
        d.step()
    assert os.getpid() not in workers and len(workers) >= 2
    for step in range(2):
        names = list(data(tmp_path, step))
        assert "Module.fc1.Linear.forward.1" in names and not any("sinh" in n for n in names)
    assert sorted(os.listdir(tmp_path)) == ["step0", "step1"]
    assert all(os.listdir(tmp_path / s) == ["rank"] for s in ("step0", "step1"))


# -- endurance (short versions; tools/endurance.py measures the sizes) -----------------------------------
def test_unselected_steps_keep_memory_flat(tmp_path):
    import tracemalloc

    model, x, _ = make("mlp")
    steps = 150
    d = PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="statistics", step=[0, steps - 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracemalloc.start()
    try:
        for i in range(steps):
            if i == 20:
                gc.collect()
                start = tracemalloc.get_traced_memory()[0]
            d.start(model=model)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            d.stop()
            d.step()
        gc.collect()
        growth = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert growth < 16 * 1024, growth                      # 130 steps, hooks on every one: nothing kept
    assert sorted(os.listdir(tmp_path)) == ["step0", f"step{steps - 1}"]


def deep_size(obj, seen):
    """tools/endurance.py's measure of a record's memory (one definition for the tool and the test)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    from endurance import deep_size as measure

    return measure(obj, seen)


def test_a_long_step_costs_its_compact_records_and_one_write(tmp_path, monkeypatch):
    import tracemalloc

    from msprobe_lite.core import writer

    d = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="statistics")
    x = torch.randn(16)
    d.start()
    torch.add(x, 1.0)                                      # warm-up: stacks, caches
    d.stop()
    d.step()
    writes = []
    real = writer.write_chunks_atomic       # every file of the dump goes through it
    monkeypatch.setattr(writer, "write_chunks_atomic", lambda path, *rest: (writes.append(path), real(path, *rest)))
    n = 2000
    gc.collect()
    tracemalloc.start()
    try:
        d.start()
        for _ in range(n // 2):
            torch.add(torch.add(x, 1.0), 1.0)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert writes == []                                    # nothing written while collecting
    session = d.session
    seen: set = set()
    compact = sum(deep_size(r, seen) for r in session.records.values())
    compact += sum(deep_size(v, seen) for v in (session.stacks.__dict__, session.construct, session.counters))
    assert len(session.records) == n
    assert traced < 1.5 * compact, (traced / n, compact / n)  # what a record costs is its compact record
    d.stop()
    assert sorted(os.path.basename(w) for w in writes) == ["construct.json", "dump.json", "stack.json"]
    d.step()                                               # nothing new since stop(): no second write
    assert len(writes) == 3 and len(data(tmp_path, 1)) == n


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_step_keeps_few_objects_for_the_garbage_collector(tmp_path, level):
    """Everything a step keeps until it is written outlives the young collections and counts towards the next
    full one, which takes ~100 ms in a process that imported torch. So a record keeps few objects in the
    collector's lists: the C encoder makes summaries and their cache entries untracked, and a finished
    forward record is sealed (its lists, dict and itself untracked); what remains is mostly gradient hooks
    and backward records. At ~10 a record (counted here), a big L1 step brought on a full collection every
    ~12 steps, at ~8 every ~30; sealed, ~2.6 a record, a small L1 step one every ~200."""
    from models import loss_of

    model, x, y = make("transformer")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    alive = {}

    def step(debugger, name):
        if debugger:
            debugger.start(model=model)
        gc.collect()
        before = len(gc.get_objects())
        loss_of("transformer", model, x, y).backward()
        opt.step()
        opt.zero_grad()
        gc.collect()
        alive[name] = len(gc.get_objects()) - before
        if debugger:
            alive["records"] = len(debugger.session.records)
            debugger.stop()
            debugger.step()

    for name, debugger in (("off", None), ("on", d), ("off", None), ("on", d)):  # warmed up: the last pair
        step(debugger, name)
    assert alive["records"] > 400
    # the Python routes seal nothing (Python has no way to take an object out of the collector's lists), so
    # their summaries, cache entries and records stay tracked: ~8.4 a record at L1, as before the seal
    bound = 4 if C_ROUTES else 10
    assert (alive["on"] - alive["off"]) / alive["records"] < bound, alive  # 9.8, then 7.9, now 2.6 (seal)


def test_sealed_records_are_freed_and_written_as_before(tmp_path):
    """A sealed record is out of the collector's lists only: reference counting still frees it and its
    summaries when the step is written, and what is written does not change. A backward record (its lists
    fill as gradients arrive) stays tracked."""
    from msprobe_lite.core.records import TensorSummary

    model, x, y = make("cnn")
    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    d.start()
    loss = model(x).sum()
    loss.backward()
    records = dict(d.session.records)
    forward = [r for n, r in records.items() if n.endswith(".forward")]
    backward = [r for n, r in records.items() if n.endswith(".backward")]
    assert len(forward) > 10 and backward
    assert all(gc.is_tracked(r.data["input"]) for r in backward if "input" in r.data)
    summaries = [s for r in forward for s in r.data["output"] if isinstance(s, TensorSummary)]
    assert summaries
    if C_ROUTES:  # the C encoder seals (the Python routes cannot untrack an object): freed all the same
        assert not any(gc.is_tracked(r) or gc.is_tracked(r.data) for r in forward)
        assert not any(gc.is_tracked(s) for s in summaries)
    d.stop()
    d.step()
    written = data(tmp_path, 0)
    del records, forward, backward
    # nothing but this list holds them (its item, the loop's name, getrefcount's argument): reference
    # counting frees them with it, no collection needed
    assert {sys.getrefcount(s) for s in summaries} == {3}
    assert written["Tensor.sum.0.forward"]["output"][0]["Max"] == pytest.approx(loss.item(), rel=1e-6)


@c_route
def test_a_seal_leaves_tracked_what_holds_a_tracked_leaf_or_a_cycle(tmp_path):
    """The C encoder's seal (Summarizer.seal) untracks a record only where nothing in it can make a cycle."""
    from msprobe_lite.core.records import Record, TensorSummary

    d = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")

    class Leaf:  # a leaf of a kind the encoder never makes stays tracked, and so do its containers
        pass

    leaf = Leaf()
    summary = TensorSummary("torch.Tensor", "torch.float32", (2,), (1.0, 0.0, 0.5, 1.0), False)
    record = Record("r", {"a": [[summary], {"k": "v"}], "b": [leaf, (leaf,)]})
    d.summarizer.seal(record)
    assert not gc.is_tracked(record.data["a"]) and not gc.is_tracked(summary)
    assert gc.is_tracked(record.data["b"]) and gc.is_tracked(record) and gc.is_tracked(leaf)
    record.data["b"] = [summary]
    d.summarizer.seal(record)
    assert not gc.is_tracked(record) and not gc.is_tracked(record.data)
    record.data["c"] = leaf  # a dict tracks itself again when given a tracked value
    assert gc.is_tracked(record.data)

    class Extra(Record):  # a slot beyond name and data is looked at too: this one holds a cycle
        __slots__ = ("extra",)

    odd = Extra("odd", {"a": [1.0]})
    odd.extra = [odd, leaf]
    d.summarizer.seal(odd)
    assert gc.is_tracked(odd)
    looped: list = [leaf]
    for _ in range(64):  # shared many times over, and holding itself: bounded work, left tracked
        looped = [looped, looped]
    looped.append(looped)
    record = Record("r", {"a": looped})
    d.summarizer.seal(record)
    assert gc.is_tracked(record) and gc.is_tracked(looped)
    looped.pop()


@pytest.fixture(params=ROUTE_PARAMS)
def record_lines(request):
    """dump.json's record lines on both routes: the C formatter, and Python where it is not built."""
    from msprobe_lite.core import writer
    if request.param == "C":
        assert writer._record_lines_c is not None  # the test set-up builds it (pip install -e .)
        return writer.record_lines
    return lambda records: writer.record_lines_python(records, {})


def test_record_text_is_what_json_writes(record_lines):
    """The writer formats records itself (faster); the text must stay byte for byte json.dumps's."""
    import enum

    import numpy as np

    from msprobe_lite.core._fast_stats import Stats
    from msprobe_lite.core.records import Record, SavedTensor, TensorSummary, json_default

    class Key(str):
        pass

    class Level(enum.IntEnum):
        HIGH = 2

    nan, inf = float("nan"), float("inf")
    shared = TensorSummary("torch.Tensor", "torch.float32", [4, 16], (2.5, -1e-300, 0.1 + 0.2, 12.25), True)
    values = [
        {"input_args": [shared, None, {"type": "int", "value": 3}], "input_kwargs": {}, "output": [shared]},
        [TensorSummary("torch.Tensor", "torch.bool", [2], (True, False, None, None), False),
         TensorSummary("torch.Tensor", "torch.int64", [], (2 ** 70, -3, 1.5, 7.0), None, md5="0a1b2c3d"),
         TensorSummary("mindspore.Tensor", "Float32", [1], (nan, -inf, inf, 2), None),
         TensorSummary("tensor", None, None), TensorSummary("t", "é\u2028", [True], None),
         TensorSummary("t", "f", torch.Size([3, 2 ** 70]), (np.float64(1.5), 1.0, 1.0, 1.0), None),
         TensorSummary("t\x7f\x01", "f", (), (1e16, 1e-5, -0.0, 123456789.125), None, md5="\u00e9"),
         TensorSummary("t", "f", [2], [1.0, 2.0, 3.0, 4.0], 1),
         TensorSummary("torch.Tensor", "torch.float32", [3], Stats((1.5, -2.0, 0.1 + 0.2, 1e300)), True),
         TensorSummary("t", "f", [3], Stats((nan, -inf, 5e-324, -0.0)), None, md5="00ff00ff"),
         SavedTensor(shared, "Torch.add.0.forward.input.0.pt"), SavedTensor(shared, "\u00e9\t.pt"),
         SavedTensor(TensorSummary("t", "f", [1], None, None), None)],
        {1: shared, None: [1.0, -0.0, 5e-324, "x\n\"\\\x1f\x7f", True]}, ("a", 2.5), {"k": (shared, [])}, [], {},
        {Key("sub"): [np.float64(0.5), Level.HIGH, 2 ** 80, -2 ** 63, 2 ** 63 - 1, "\U0001f600"]},
        {"deep": [[[[{"x": [shared]}]]]]}, 3, "text", None, True,
    ]
    records = [Record(f"Torch.add.{i}.forward", v) for i, v in enumerate(values)]
    for record in records:
        expected = f"{json.dumps(record.name)}: {json.dumps(record.data, default=json_default)}"
        assert record_lines([record]).decode() == expected
    assert record_lines(records) == ",\n".join(
        f"{json.dumps(r.name)}: {json.dumps(r.data, default=json_default)}" for r in records).encode()
    assert record_lines([]) == b""


@c_route
def test_the_c_formatter_reads_stats_whatever_is_imported_first():
    """The C formatter writes a Stats (core/_fast_stats.c) from its doubles: also in a process whose first
    import is the writer (compare's import order), before anything imported _fast_stats."""
    import subprocess
    import sys

    program = (
        "import msprobe_lite.core.writer\n"
        "from msprobe_lite.core._fast_json import record_lines\n"
        "from msprobe_lite.core._fast_stats import Stats\n"
        "from msprobe_lite.core.records import Record, SavedTensor, TensorSummary\n"
        "calls = []\n"
        "class Summary(TensorSummary):\n"
        "    __slots__ = ()\n"
        "    def json_text(self, data_name=None):\n"
        "        calls.append(1)\n"
        "        return super().json_text(data_name)\n"
        "s = Summary('torch.Tensor', 'torch.float32', (2,), Stats((1.5, -2.0, 0.25, 2.5)), True)\n"
        "import json\n"
        "text = record_lines([Record('r', {'a': [s]})], Summary, SavedTensor, json.dumps, "
        "json.encoder.encode_basestring_ascii)\n"
        "assert not calls, 'the formatter asked the summary for its text'\n"
        "print(text.decode())\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ('"r": {"a": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], '
                                   '"Max": 1.5, "Min": -2.0, "Mean": 0.25, "Norm": 2.5, "requires_grad": true}]}')


def test_record_text_of_other_record_classes_and_many_summaries(record_lines):
    """The C route reads Record and TensorSummary fields from their slots and keeps the summaries it wrote in
    a table of its own: other classes (read by attribute), a slot left unset (an error, as in Python) and
    thousands of summaries recurring across records (the table grows) give json's text."""
    from msprobe_lite.core.records import Record, TensorSummary, json_default

    class Plain:  # not a Record: read by attribute
        def __init__(self, name, data):
            self.name, self.data = name, data

    class Sub(Record):
        __slots__ = ("extra",)

    many = [TensorSummary("torch.Tensor", "torch.float32", (i, 2), (float(i), -1.0, 0.5, i / 7), i % 2 == 0)
            for i in range(5000)]
    records = [Plain("first", {"output": many[:10]}), Record("r", {"input_args": many, "output": many[::-1]}),
               Sub("sub", {"x": many[4000:4010]}), Plain("again", {"output": many[:3]})]
    assert record_lines(records) == ",\n".join(
        f"{json.dumps(r.name)}: {json.dumps(r.data, default=json_default)}" for r in records).encode()
    unset = TensorSummary("torch.Tensor", "torch.float32", (1,))
    del unset.md5
    with pytest.raises(AttributeError):
        record_lines([Record("r", {"output": [unset]})])

    class Big:
        __slots__ = ("a", "b", "c", "d")

    class Lookalike:  # two slots like Record, but its name and data are another class's descriptors
        __slots__ = ("x", "y")
        name, data = Big.c, Big.d

    odd = Lookalike()
    odd.x = odd.y = 1
    with pytest.raises(TypeError):  # as Python says: the descriptor does not apply to this object
        record_lines([odd])


def _doubles_hard_to_print(rnd) -> list:
    """Finite doubles from every corner of the format: random bit patterns (every exponent), float32 values
    (the Max and Min of most tensors), integers, powers of ten and two with their neighbours, subnormals."""
    import math
    import struct

    def from_bits(fmt, bits):
        return struct.unpack(fmt, rnd.getrandbits(bits).to_bytes(struct.calcsize(fmt), "little"))[0]

    values = [from_bits("<d", 64) for _ in range(150_000)] + [from_bits("<f", 32) for _ in range(150_000)]
    values += [from_bits("<d", 52) for _ in range(20_000)]  # subnormals
    values += [rnd.uniform(-10, 10) for _ in range(50_000)]
    values += [float(rnd.randrange(-2 ** 62, 2 ** 62) >> rnd.randrange(62)) for _ in range(50_000)]
    for e in range(-324, 309):
        for m in ("1", "2", "5", "9", "1.5", "2.5", "9.5", "9.999999999999999", "4.9406564584124654"):
            v = float(f"{m}e{e}")
            values += [v, math.nextafter(v, 0), math.nextafter(v, math.inf)]
    for e in range(-1074, 1024):
        v = math.ldexp(1.0, e)
        values += [v, math.nextafter(v, 0), math.nextafter(v, math.inf), v * 1.5]
    values += [0.0, -0.0, 0.1, 0.1 + 0.2, 1 / 3, 123.0, 1e15, 1e16, 1e-4, 1e-5, 2.0 ** 53 + 2, sys.float_info.max,
               sys.float_info.min, 5e-324]
    values += [-v for v in values]
    return [v for v in values if math.isfinite(v)]


@c_route
def test_c_floats_are_written_as_float_repr():
    """The C writer formats floats through PyOS_double_to_string: the characters must be float.__repr__'s, as
    json.dumps writes them, for every double."""
    import random

    from msprobe_lite.core import writer
    from msprobe_lite.core.records import Record

    assert writer._record_lines_c is not None
    values = _doubles_hard_to_print(random.Random(20261125))
    assert len(values) > 800_000
    written = writer.record_lines([Record("r", values)]).decode()
    if written != '"r": ' + json.dumps(values):
        wrong = [(v, text) for v, text in zip(values, written[6:-1].split(", ")) if text != repr(v)]
        pytest.fail(f"{len(wrong)} floats differ from repr, e.g. {wrong[:5]}")


def test_edge_floats_are_written_as_json_writes_them(record_lines):
    """Floats at the edges of the format (signed zero, subnormals, the largest double, where repr switches to an
    exponent, NaN and the infinities) read the same on both routes: in lists, in a summary's tuple of
    statistics and in a Stats (its doubles read in place by the C route)."""
    import math

    from msprobe_lite.core.records import Record, TensorSummary, json_default
    try:
        from msprobe_lite.core._fast_stats import Stats
    except ImportError:  # the Python routes only: no Stats to meet
        Stats = None

    edges = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308,
             -1.7976931348623157e308, 1e16, 9999999999999998.0, 1e15, 1e-7, 1e-4, 1e-5, 0.0001, 0.1 + 0.2, 0.1,
             1 / 3, 123.0, 2.0 ** 53, 2.0 ** 53 + 2, 1e22, 1e23, 1.5e-323, math.nan, -math.nan, math.inf, -math.inf]
    edges += [-v for v in edges]
    records = [Record("list", {"v": edges})]
    for i in range(0, len(edges) - 3, 4):
        four = tuple(edges[i:i + 4])
        records.append(Record(f"tuple.{i}", {"v": [TensorSummary("t", "f", [4], four, None)]}))
        if Stats is not None:
            records.append(Record(f"stats.{i}", {"v": [TensorSummary("t", "f", [4], Stats(four), True)]}))
    for record in records:
        assert record_lines([record]).decode() == f"{json.dumps(record.name)}: " + json.dumps(
            record.data, default=json_default)
    assert '"Max": -0.0' in record_lines(records).decode()
    assert "NaN, NaN, Infinity, -Infinity" in record_lines(records[:1]).decode()


def test_a_summary_freed_while_a_record_is_written_never_lends_its_text(record_lines):
    """Summary texts are reused within a write by identity; a summary replaced while Python code runs (a
    fallback here, another thread in a run) must not pass its text to a new object at the same address."""
    from msprobe_lite.core.records import Record, TensorSummary

    data: list = []

    class Other(TensorSummary):  # not the exact type: formatted by json, through Python code
        def to_json(self, data_name=None):
            data[0] = None
            data[2] = TensorSummary("torch.Tensor", "NEW", (1,), (2.0, 2.0, 2.0, 2.0))
            return {"other": 1}

    for _ in range(20):
        data[:] = [TensorSummary("torch.Tensor", "OLD", (1,), (1.0, 1.0, 1.0, 1.0)), Other("t", "d", ()), None]
        text = record_lines([Record("r", {"v": data})]).decode()
        assert text.count('"dtype": "OLD"') == 1 and text.count('"dtype": "NEW", "shape": [1], "Max": 2.0') == 1


def test_record_text_that_json_refuses_is_refused(record_lines):
    """A value json cannot write fails the write the same way on both routes (and the step stays dirty)."""
    from msprobe_lite.core.records import Record

    with pytest.raises(TypeError):
        record_lines([Record("odd", {"x": object()})])
    with pytest.raises(TypeError):
        record_lines([Record(3, {})])
    looped: list = []
    looped.append(looped)
    with pytest.raises((ValueError, RecursionError)):
        record_lines([Record("loop", {"x": looped})])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
def test_dump_json_written_in_pieces_is_one_json_document(n):
    from msprobe_lite.core.records import Record
    from msprobe_lite.core.writer import dump_json_chunks

    header = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}
    records = [Record(f"Torch.add.{i}.forward", {"output": [{"type": "int", "value": i}]}) for i in range(n)]
    text = b"".join(dump_json_chunks(header, records, per=3)).decode()
    assert json.loads(text) == {**header, "data": {r.name: r.data for r in records}}
    assert text.count("\n") == n + 1 + (n > 0)            # one record per line


def test_construct_and_stack_text_is_what_json_writes():
    """json_lines writes str, None and nested lists itself: each entry's text is json.dumps's, byte for byte."""
    from msprobe_lite.core.writer import json_lines

    mapping = {"Torch.add.0.forward": None, "Module.fc.Linear.forward.0": "Module.block.Block.forward.0",
               "0": [["Torch.add.0.forward", "é \"quoted\" \\ \n"], ["File a.py, line 3, in f, \n x = 1"]],
               "1": [[], []], "2": "optimizer", "3": [None, "x", [["deep"]]], "4": 3, "5": {"k": [1.5, True]},
               "ü": [1, 2.25, False]}
    text = json_lines(mapping)
    assert json.loads(text) == mapping
    assert text.split("\n")[1:-2] == [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in mapping.items()][:-1] + \
        [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in list(mapping.items())[-1:]]
    assert json_lines({}) == "{}\n"


def test_numpy_scalars_json_cannot_hold_still_leave_the_step_written(tmp_path):
    """complex, datetime64 and timedelta64 scalars are written as their text: the step is not lost."""
    import numpy as np

    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="debug")
    debugger.start()
    debugger.save({"c": np.complex64(1 + 2j), "d": np.datetime64("2026-11-22"), "t": np.timedelta64(3, "s"),
                   "b": np.bytes_(b"x")}, "odd")
    debugger.stop()
    debugger.step()
    saved = load(tmp_path, name="debug.json")["data"]["odd.0.debug"]
    assert saved["c"] == {"type": "complex64", "value": "(1+2j)"}
    assert saved["d"] == {"type": "datetime64", "value": "2026-11-22"}
    assert saved["t"]["value"] == "0:00:03" and saved["b"]["value"] is None
