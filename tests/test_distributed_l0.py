"""Two gloo processes: each rank writes rank{R}/, and the rank filter selects ranks."""
from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import data


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


def test_rank_filter_selects_ranks(tmp_path):
    dump = run(tmp_path, ranks=[1])
    assert sorted(p.name for p in (dump / "step0").iterdir()) == ["rank1"]


def _ddp_worker(rank, world, port, config, out):
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
        x = torch.randn(5, 4)
        d = PrecisionDebugger(config)
        d.start(model=model)
        model(x).pow(2).sum().backward()
        d.stop()
        d.step()
        torch.save({name: p.grad for name, p in model.module.named_parameters()}, os.path.join(out, f"grad{rank}.pt"))
    finally:
        dist.destroy_process_group()


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
            layer = name.split(".")[2]  # Module.module.<i>.Linear.parameters_grad.0
            for pname, (entry,) in dump[name].items():
                assert_stats(entry, grads[f"{layer}.{pname}"])
    assert data(tmp_path / "dump", rank=0)[names[0]] == data(tmp_path / "dump", rank=1)[names[0]]
