"""Two gloo processes: each rank writes rank{R}/, and the rank filter selects ranks."""
from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import data, leave_spawned_worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, config):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from models import make
    from msprobe_lite.pytorch import PrecisionDebugger

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, x, _ = make("mlp", seed=rank)
        d = PrecisionDebugger(config)
        d.start(model=model)
        model(x).sum().backward()
        d.stop()
        d.step()
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def run(tmp_path, ranks=()):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                                  "rank": list(ranks)}))
    mp.spawn(_worker, args=(2, _free_port(), str(config)), nprocs=2, join=True)
    return tmp_path / "dump"


def test_each_rank_writes_its_own_folder(tmp_path):
    dump = run(tmp_path)
    assert sorted(p.name for p in (dump / "step0").iterdir()) == ["rank0", "rank1"]
    r0, r1 = data(dump, rank=0), data(dump, rank=1)
    assert list(r0) == list(r1)
    # different seeds per rank: the inputs differ, so each rank dumped its own numbers
    assert r0["Module.fc1.Linear.forward.0"]["input_args"][0]["Max"] != \
        r1["Module.fc1.Linear.forward.0"]["input_args"][0]["Max"]
    assert torch.isfinite(torch.tensor(r0["Module.fc1.Linear.forward.0"]["output"][0]["Norm"]))


def test_rank_filter_selects_ranks(tmp_path, capfd):
    dump = run(tmp_path, ranks=[1])
    assert sorted(p.name for p in (dump / "step0").iterdir()) == ["rank1"]
    err = capfd.readouterr().err
    assert "config rank=[1] does not select rank 0: this process dumps nothing" in err and "WARNING" not in err
    # each line says which rank printed it (a warning printed by every rank read as duplicated, untagged)
    assert "[msprobe_lite rank0] INFO: config rank=[1] does not select rank 0" in err
    assert "[msprobe_lite rank1] INFO: dumping task=statistics" in err


def test_a_rank_filter_that_selects_no_rank_of_the_job_is_a_warning(tmp_path, capfd):
    """`rank: [5]` in a 2-process job: each rank said at INFO that it was left out, as the ranks a filter
    leaves out usually are, and nothing was dumped (a new user's trial). Each now warns."""
    dump = run(tmp_path, ranks=[5, "7-9"])
    assert not (dump / "step0").exists()
    err = capfd.readouterr().err
    assert err.count("WARNING: config rank=[5, '7-9'] selects no rank of this 2-rank job (ranks 0 to 1): "
                     "nothing will be dumped") == 2, err


def _ddp_worker(rank, world, port, config, out, shift=0.0):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from msprobe_lite.pytorch import PrecisionDebugger

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 6),
                                                                              torch.nn.Tanh(), torch.nn.Linear(6, 2)))
        torch.manual_seed(10 + rank)                 # each rank its own batch: local gradients differ
        x = torch.randn(5, 4) + (shift if rank == 1 else 0.0)
        d = PrecisionDebugger(config)
        d.start(model=model)
        model(x).pow(2).sum().backward()
        d.stop()
        d.step()
        torch.save({name: p.grad for name, p in model.module.named_parameters()}, os.path.join(out, f"grad{rank}.pt"))
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def test_parameter_gradients_under_ddp_are_the_averaged_grad(tmp_path):
    """DistributedDataParallel writes the gradient averaged over ranks into `.grad` once the backward pass
    ends; parameters_grad was read at accumulation and held each rank's own (a new user's trial: a change on
    one rank then showed nothing on the other). It is now `.grad` as the optimizer gets it, the same on both
    ranks."""
    from helpers import assert_stats

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump")}))
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(config), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        grads = torch.load(tmp_path / f"grad{rank}.pt", weights_only=True)
        dump = data(tmp_path / "dump", rank=rank)
        names = [n for n in dump if ".parameters_grad" in n]
        assert names, list(dump)
        for name in names:
            layer = name.split(".")[1]  # Module.<i>.Linear.parameters_grad.0
            for pname, (entry,) in dump[name].items():
                assert_stats(entry, grads[f"{layer}.{pname}"])
    assert data(tmp_path / "dump", rank=0)[names[0]] == data(tmp_path / "dump", rank=1)[names[0]]


def test_a_ddp_run_is_named_as_the_network_inside_it(tmp_path):
    """DDP holds the network as `.module`: every record was `Module.module.<path>`, and the wrapped network
    itself a record (`Module.module.Sequential`), so a DDP run and a single-process run of the same network
    did not pair (a new user's trial: "97 unmatched in target, 95 in golden" for identical numbers). The
    debugger records the network inside the wrapper, named as without it."""
    from msprobe_lite.pytorch import PrecisionDebugger

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "mix", "dump_path": str(tmp_path / "ddp")}))
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(config), str(tmp_path)), nprocs=2, join=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    torch.manual_seed(10)
    x = torch.randn(5, 4)
    d = PrecisionDebugger(dump_path=str(tmp_path / "plain"), task="statistics", level="mix")
    d.start(model=model)
    model(x).pow(2).sum().backward()
    d.stop()
    d.step()
    ddp, plain = data(tmp_path / "ddp", rank=0), data(tmp_path / "plain")
    assert [n for n in ddp if not n.startswith("Distributed.")] == list(plain)
    assert "Module.0.Linear.forward.0" in plain
    for name, record in plain.items():  # rank 0's batch is the plain run's: the same numbers
        if "parameters_grad" not in name:
            assert ddp[name] == record, name


def test_compare_of_ddp_ranks_says_where_another_ranks_difference_comes_in(tmp_path):
    """Input data changed on rank 1 only. Rank 0 computed the same gradients as its golden, but DDP's
    all-reduce (no record) averaged rank 1's into them: rank 0's line named its parameter gradients as
    introduced, the untouched rank the strongest verdict, with nothing pointing at rank 1 (a new user's
    trial). The reason now says so."""
    from msprobe_lite.compare import compare
    from msprobe_lite.compare.judge import ACROSS_RANKS

    dumps = {}
    for run_name, shift in (("golden", 0.0), ("target", 0.5)):
        config = tmp_path / f"{run_name}.json"
        config.write_text(json.dumps({"task": "statistics", "level": "L0",
                                      "dump_path": str(tmp_path / run_name)}))
        mp.spawn(_ddp_worker, args=(2, _free_port(), str(config), str(tmp_path), shift), nprocs=2, join=True)
        dumps[run_name] = str(tmp_path / run_name)
    pairs = {p["rank"]: p for p in compare(dumps["target"], dumps["golden"], str(tmp_path / "out")).pairs}
    untouched, changed = pairs[0], pairs[1]
    assert ".parameters_grad." in untouched["first_divergence"]["name"], untouched
    assert ACROSS_RANKS in untouched["first_divergence"]["reason"]
    assert changed["first_seen"]["name"] == "Module.0.Linear.forward.0", changed
    assert "(most in input.0)" in changed["first_seen"]["reason"]
    assert "distributed" not in changed["first_seen"]["reason"]  # step 0's input data: no all-reduce reaches it
    # one verdict for the step across its ranks: where the runs parted, and who only received it
    summary = compare(dumps["target"], dumps["golden"], str(tmp_path / "out2"), quiet=True)
    assert summary.across_ranks == [{"step": 0, "parted": {1: "Module.0.Linear.forward.0"},
                                     "received": {0: untouched["first_divergence"]["name"]}}]
    assert "[step 0] across ranks: the runs parted on rank 1" in (tmp_path / "out2" / "report.html").read_text()
