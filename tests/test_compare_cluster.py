"""compare --scheduler: the step/rank pairs of a many-rank dump compared on a Dask cluster (a LocalCluster of two
worker processes) give what the local run gives, the verdict across ranks included; no Dask, or no scheduler at
the address, is a one-line error."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dask.utils import key_split
from distributed import LocalCluster, SchedulerPlugin

from helpers import leave_spawned_worker
from msprobe_lite.cli import main
from msprobe_lite.compare import CompareError, compare

RANKS = 16
STEPS = 2
FIRST_CALL = "Module.0.Linear.forward.0"  # where rank 1's shifted batch first enters the network


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank, world, port, config, shift):
    """Two training steps of a DistributedDataParallel network; rank 1's batches shifted by `shift` (the fault
    planted in the target), which DDP's all-reduce carries into every rank's gradients."""
    from msprobe_lite.pytorch import PrecisionDebugger

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(10 + rank)  # each rank its own batches
        debugger = PrecisionDebugger(config)
        for _ in range(STEPS):
            x = torch.randn(5, 4) + (shift if rank == 1 else 0.0)
            debugger.start(model=model)
            model(x).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            debugger.stop()
            debugger.step()
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def _widen(dump, ranks: int) -> None:
    """The dump of a `ranks`-process job: ranks 2 and up are rank 0's dump again (a job of 16 processes is too
    slow for this machine's two cores), so each of them, like rank 0, only received rank 1's difference."""
    for step in range(STEPS):
        for rank in range(2, ranks):
            shutil.copytree(dump / f"step{step}" / "rank0", dump / f"step{step}" / f"rank{rank}")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    for run, shift in (("golden", 0.0), ("target", 0.5)):
        config = root / f"{run}.json"
        config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(root / run)}))
        mp.spawn(_ddp_worker, args=(2, _free_port(), str(config), shift), nprocs=2, join=True)
        _widen(root / run, RANKS)
    return root


class _Done(SchedulerPlugin):
    """Counts the tasks the workers finished, by the name of their function."""

    def __init__(self):
        self.done = Counter()

    def transition(self, key, start, finish, *args, **kwargs):
        if finish == "memory":
            self.done[key_split(key)] += 1


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0") as cluster:
        cluster.scheduler.add_plugin(_Done(), name="done")
        yield cluster


@pytest.fixture
def scheduler(cluster):
    return cluster.scheduler_address


def _pairs_done(cluster) -> int:
    """Step/rank pairs the cluster's workers have compared so far (tasks of compare's _one_in_worker)."""
    return cluster.scheduler.plugins["done"].done["one_in_worker"]


def _run(dumps, out, capsys, *more) -> tuple:
    """(exit status, standard output with the output folder's name taken out, standard error)."""
    status = main(["compare", "-tp", str(dumps / "target"), "-gp", str(dumps / "golden"), "-o", str(out), *more])
    said = capsys.readouterr()
    return status, said.out.replace(str(out), "OUT"), said.err


def _tables(out) -> dict:
    """{table's name without its timestamp: its text} of every CSV table in `out`."""
    return {re.sub(r"_\d{14}\.csv$", ".csv", name): (out / name).read_text()
            for name in os.listdir(out) if name.endswith(".csv")}


def _summary(out) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    for pair in summary["pairs"]:
        assert os.path.dirname(pair["result_file"]) == str(out)
        pair["result_file"] = re.sub(r"_\d{14}\.csv$", ".csv", os.path.basename(pair["result_file"]))
    return summary


def _report(out) -> str:
    """report.html without the output folder and the tables' timestamps."""
    return re.sub(r"_\d{14}\.csv", ".csv", (out / "report.html").read_text().replace(str(out), "OUT"))


def test_a_cluster_compares_every_rank_as_the_local_run_does(dumps, cluster, scheduler, tmp_path, capsys):
    here, there = tmp_path / "local", tmp_path / "cluster"
    status, said, _ = _run(dumps, here, capsys)
    done = _pairs_done(cluster)
    assert status == 0 and _run(dumps, there, capsys, "--scheduler", scheduler)[:2] == (0, said)
    assert _pairs_done(cluster) - done == RANKS * STEPS  # each pair compared by a worker, none here
    summary, tables = _summary(here), _tables(here)
    assert _summary(there) == summary and _tables(there) == tables and len(tables) == RANKS * STEPS
    assert _report(there) == _report(here)
    assert sorted((p["step"], p["rank"]) for p in summary["pairs"]) == [(s, r) for s in range(STEPS)
                                                                         for r in range(RANKS)]
    # the planted fault: rank 1's batch parted the runs at the first call; every other rank only received it
    # through DDP's all-reduce of the gradients
    (step0, *_) = summary["across_ranks"]
    assert step0["step"] == 0 and step0["parted"] == {"1": FIRST_CALL}
    assert sorted(map(int, step0["received"])) == [r for r in range(RANKS) if r != 1]
    assert all(".parameters_grad." in name for name in step0["received"].values())
    assert "[step 0] across ranks: the runs parted on rank 1" in said


def test_a_damaged_rank_is_said_in_its_place_and_the_others_compared(dumps, scheduler, tmp_path, capsys):
    """A rank's unreadable dump.json, locally and on a worker: that pair's one line where its answer would be,
    every other pair compared, written and answered (rank 1's divergence included), summary.json's "failed"
    naming it, exit 2."""
    damaged = tmp_path / "dumps"
    for side in ("target", "golden"):
        shutil.copytree(dumps / side, damaged / side)
    bad = damaged / "target" / "step1" / "rank5" / "dump.json"
    bad.write_text('{"task": "statistics", "data": {')
    runs = {}
    for route, more in (("local", ()), ("cluster", ("--scheduler", scheduler))):
        status, said, err = _run(damaged, tmp_path / route, capsys, *more)
        runs[route] = (status, said, _summary(tmp_path / route))
    assert runs["local"] == runs["cluster"]
    status, said, summary = runs["local"]
    assert status == 2 and "could not be compared" in err
    (failed,) = summary["failed"]
    assert (failed["step"], failed["rank"]) == (1, 5) and str(bad) in failed["error"]
    assert f"[step 1 rank 5] not compared: {bad}: not valid JSON" in said.replace("\n    ", " ")
    assert len(summary["pairs"]) == 2 * RANKS - 1 and "[step 0] across ranks: the runs parted on rank 1" in said
    assert f"ranks 0, 2-{RANKS - 1} only received the difference" in said.replace("\n    ", " ")


def _cli(dumps, tmp_path, address, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msprobe_lite", "compare", "-tp", str(dumps / "target"), "-gp",
                           str(dumps / "golden"), "-o", str(tmp_path / "out"), "--scheduler", address],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))


def test_no_scheduler_at_the_address_is_a_one_line_error(dumps, tmp_path):
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    done = _cli(dumps, tmp_path, address, DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT="1s")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == (f"msprobe-lite compare: cannot reach the Dask scheduler at {address}: "
                           f"Timed out trying to connect to {address} after 1 s\n")
    done = _cli(dumps, tmp_path, "127.0.0.1")
    assert done.returncode == 2 and done.stderr == ("msprobe-lite compare: cannot reach the Dask scheduler at "
                                                    "127.0.0.1: missing port number in address '127.0.0.1'\n")


def test_without_dask_the_scheduler_says_what_to_install(dumps, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed: its import raises ImportError
    status, said, err = _run(dumps, tmp_path / "out", capsys, "--scheduler", "tcp://127.0.0.1:8786")
    assert status == 2 and said == "" and err == (
        "msprobe-lite compare: --scheduler tcp://127.0.0.1:8786: Dask is not installed "
        "(pip install msprobe_lite[distributed])\n")


def test_a_worker_without_msprobe_lite_is_named_not_waited_for(dumps, tmp_path):
    """A worker that cannot import msprobe_lite cannot unpickle a pair: the pair would wait for ever."""
    hide = tmp_path / "hide.py"
    hide.write_text("import sys\nsys.modules['msprobe_lite'] = None  # as if not installed\n")
    with LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=":0",
                      preload=[str(hide)]) as cluster:
        with pytest.raises(CompareError) as error:
            compare(str(dumps / "target"), str(dumps / "golden"), str(tmp_path / "out"), quiet=True,
                    scheduler=cluster.scheduler_address)
        (worker,) = cluster.scheduler.workers
    assert str(error.value) == (
        f"the Dask worker {worker} of the scheduler at {cluster.scheduler_address} cannot import msprobe_lite "
        f"(No module named 'msprobe_lite.compare'; 'msprobe_lite' is not a package): install msprobe_lite on every "
        f"worker")


def test_a_scheduler_without_workers_is_said_not_waited_for(dumps, tmp_path, monkeypatch):
    from msprobe_lite.compare import cluster as route

    monkeypatch.setattr(route, "WAIT_FOR_WORKERS", 1)
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as empty:
        with pytest.raises(CompareError, match=r"has no worker \(none joined within 1 s\): start them with "
                                               r"`dask worker tcp://"):
            compare(str(dumps / "target"), str(dumps / "golden"), str(tmp_path / "out"), quiet=True,
                    scheduler=empty.scheduler_address)


def _unwritable(job):
    raise FileNotFoundError(2, "No such file or directory", job[4] + "/compare_result.csv.partial")


def test_an_output_folder_a_worker_does_not_see_is_one_line(scheduler, tmp_path):
    """The usual slip: the output folder is not mounted on the workers. The worker's OSError reads as one line
    naming the pair and what each worker needs, not as a traceback."""
    from msprobe_lite.compare.cluster import run_on

    with pytest.raises(CompareError, match=r"comparing step 0 rank 3: \[Errno 2\] No such file or directory: "
                                           r"'/nowhere/compare_result.csv.partial' \(each worker must see"):
        list(run_on(scheduler, _unwritable, [(0, 3, "t", "g", "/nowhere")]))


def test_workers_and_a_scheduler_are_one_or_the_other(dumps, tmp_path, capsys):
    with pytest.raises(CompareError, match=r"^workers=2 and scheduler='tcp://127.0.0.1:8786': give one, not both$"):
        compare(str(dumps / "target"), str(dumps / "golden"), str(tmp_path / "out"), quiet=True, workers=2,
                scheduler="tcp://127.0.0.1:8786")
    status, said, err = _run(dumps, tmp_path / "out", capsys, "-n", "2", "--scheduler", "tcp://127.0.0.1:8786")
    assert status == 2 and said == "" and "argument --scheduler: not allowed with argument -n/--workers" in err


def test_the_benchmark_runs_both_routes_and_finds_the_same_summary(capsys):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    import bench_cluster

    assert bench_cluster.main(["--ranks", "4", "--records", "200", "--workers", "2"]) == 0
    assert re.fullmatch(r"4 ranks x 200 records a side, 2 processes: local \d+\.\d s, LocalCluster \d+\.\d s "
                        r"\(\+\d+\.\d s to start it\), same summary\n", capsys.readouterr().out)
