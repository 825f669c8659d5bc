"""Collectives under gloo (2 processes): Distributed.* records whose output is the buffer after the op."""
from __future__ import annotations

import json
import os
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import assert_stats, data, leave_spawned_worker
from test_distributed_l0 import _free_port


def _worker(rank, world, port, config, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from msprobe_lite.pytorch import PrecisionDebugger
    try:
        d = PrecisionDebugger(config)
        original = dist.all_reduce
        pair = dist.new_group([0, 1])
        d.start()
        assert dist.all_reduce is not original       # wrapped only while collecting
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t)                           # sum over ranks: 1 + 2 = 3
        u = torch.arange(4.0) * (rank + 1)
        work = dist.all_reduce(u, op=dist.ReduceOp.SUM, group=pair, async_op=True)  # recorded once done
        work.wait()
        gathered = [torch.zeros(2) for _ in range(world)]
        dist.all_gather(gathered, torch.full((2,), float(rank)))
        # P2POp accepts only torch's own isend/irecv (an identity check): they are not wrapped, and a
        # batched exchange made while collecting runs (it raised ValueError before)
        by_keyword = torch.full((2,), float(rank + 1))
        dist.all_reduce(tensor=by_keyword)           # its buffer is in the output too (it was empty)
        received = torch.zeros(2)
        ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank + 5)), 1 - rank),
               dist.P2POp(dist.irecv, received, 1 - rank)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        assert received.tolist() == [float(6 - rank)] * 2
        d.stop()
        d.step()
        assert dist.all_reduce is original           # restored at stop()
        torch.save({"t": t, "u": u, "g": gathered, "k": by_keyword}, os.path.join(out, f"live{rank}.pt"))
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def test_collectives_are_recorded_with_buffers_after_the_operation(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "dump")}))
    mp.spawn(_worker, args=(2, _free_port(), str(config), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        dump = data(tmp_path / "dump", rank=rank)
        live = torch.load(tmp_path / f"live{rank}.pt", weights_only=True)
        names = [n for n in dump if n.startswith("Distributed.")]
        assert names == ["Distributed.all_reduce.0.forward", "Distributed.all_reduce.1.forward",
                         "Distributed.all_gather.0.forward", "Distributed.all_reduce.2.forward",
                         "Distributed.batch_isend_irecv.0.forward"]
        assert_stats(dump["Distributed.all_reduce.2.forward"]["output"][0], live["k"])
        assert dump["Distributed.all_reduce.2.forward"]["output"][0]["Max"] == 3.0
        first = dump["Distributed.all_reduce.0.forward"]
        assert_stats(first["input_args"][0], torch.full((3,), float(rank + 1)))
        assert_stats(first["output"][0], live["t"])
        assert first["output"][0]["Max"] == 3.0
        second = dump["Distributed.all_reduce.1.forward"]
        assert_stats(second["output"][0], live["u"])
        assert len(second["output"]) == 1  # op, group and async_op are inputs, not buffers (op read "inf")
        assert second["input_kwargs"] == {
            "op": {"type": "torch.distributed.ReduceOp", "value": "RedOpType.SUM"},
            # the reference tool's group id: the CRC-32 of the rank list's text
            "group": {"type": "torch.ProcessGroup", "group_ranks": [0, 1], "group_id": f"{zlib.crc32(b'[0, 1]'):08x}"},
            "async_op": {"type": "bool", "value": True}}
        gather = dump["Distributed.all_gather.0.forward"]
        for i in range(2):
            assert_stats(gather["output"][0][i], live["g"][i])


def _logging_worker(rank, world, port, config, shift):
    """A training step that all-reduces its loss for logging, as most scripts do; rank 1's data shifted."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from msprobe_lite.pytorch import PrecisionDebugger
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
        torch.manual_seed(10 + rank)
        x = torch.randn(5, 4) + (shift if rank == 1 else 0.0)
        d = PrecisionDebugger(config)
        d.start(model=model)
        loss = model(x).pow(2).mean()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        loss.backward()
        d.stop()
        d.step()
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def test_a_collective_on_an_untouched_rank_says_the_difference_came_from_another_rank(tmp_path):
    """Input data changed on rank 1 only; both ranks all-reduce the loss for logging. Rank 0's line named that
    all_reduce as introduced (its inputs agree, its result differs) with nothing pointing at rank 1 (a new
    user's DDP trial). It is still the call named, with the reason that says where to look."""
    from msprobe_lite.compare import compare
    from msprobe_lite.compare.judge import ACROSS_RANKS_COLLECTIVE

    dumps = {}
    for run_name, shift in (("golden", 0.0), ("target", 0.5)):
        config = tmp_path / f"{run_name}.json"
        config.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / run_name)}))
        mp.spawn(_logging_worker, args=(2, _free_port(), str(config), shift), nprocs=2, join=True)
        dumps[run_name] = str(tmp_path / run_name)
    pairs = {p["rank"]: p for p in compare(dumps["target"], dumps["golden"], str(tmp_path / "out"), quiet=True).pairs}
    untouched = pairs[0]["first_divergence"]
    assert untouched["name"] == "Distributed.all_reduce.0.forward", untouched
    assert ACROSS_RANKS_COLLECTIVE in untouched["reason"]
    changed = pairs[1]
    assert changed["first_seen"]["name"] == "Functional.linear.0.forward", changed
    assert ACROSS_RANKS_COLLECTIVE not in json.dumps(changed)
