"""Compare throughput: two synthetic dumps, timed end to end (including the CSV, summary.json, report.html).

Statistics mode (default): N records per side (default 100k) that look like an L1 dump (two tensor inputs,
a scalar keyword, one output; a forward and a backward record per call, a few hundred APIs). Reports
records/s and MB/s of dump.json read. Tensor mode (--tensors K): K float32 tensors of --elements each per
side, saved as .npy, compared with --workers processes; reports MB/s of tensor files read.

    .venv/bin/python tools/bench_compare.py --records 100000 [--repeat 5] [--memory]
    .venv/bin/python tools/bench_compare.py --tensors 48 --elements 1000000 --workers 1
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from msprobe_lite.compare import compare  # noqa: E402
from msprobe_lite.core.writer import dump_json_chunks  # noqa: E402


def tensor(rng, shape, scale=1.0):
    mx, mn = rng.random() * scale, -rng.random() * scale
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": mx, "Min": mn,
            "Mean": (mx + mn) / 4, "Norm": scale * 10 * rng.random() + 1, "requires_grad": True}


def write_dump(folder, records, seed, noise):
    rng = random.Random(seed)
    base = random.Random(0)
    data = {}
    apis = [f"op{i}" for i in range(300)]
    counters = {}
    for i in range(records // 2):
        api = apis[base.randrange(len(apis))]
        n = counters[api] = counters.get(api, -1) + 1
        shape = [8, 128, 256]
        fwd = {"input_args": [tensor(base, shape), tensor(base, shape)],
               "input_kwargs": {"alpha": {"type": "float", "value": 1.0}}, "output": [tensor(base, shape)]}
        bwd = {"input": [tensor(base, shape)], "output": [tensor(base, shape), tensor(base, shape)]}
        for rec in (fwd, bwd):
            for part in rec.values():
                for t in (part if isinstance(part, list) else []):
                    t["Mean"] += noise * rng.random()
        data[f"Functional.{api}.{n}.forward"] = fwd
        data[f"Functional.{api}.{n}.backward"] = bwd
    os.makedirs(folder)
    path = os.path.join(folder, "dump.json")
    header = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None}
    with open(path, "wb") as f:  # as msprobe_lite's dumper writes it: a record per line
        for piece in dump_json_chunks(header, [Record(name, record) for name, record in data.items()]):
            f.write(piece)
    return path


class Record:
    def __init__(self, name, data):
        self.name, self.data = name, data


def write_tensor_dump(folder, count, elements, seed):
    """A tensor-mode dump of `count` forward records, one float32 output each, in .npy files."""
    import numpy as np

    rng = np.random.default_rng(0)
    noise = np.random.default_rng(seed)
    data_dir = os.path.join(folder, "dump_tensor_data")
    os.makedirs(data_dir)
    data = {}
    for i in range(count):
        array = rng.standard_normal(elements, dtype=np.float32)
        array += noise.standard_normal(elements, dtype=np.float32) * np.float32(1e-6)
        name = f"Functional.op{i}.0.forward"
        np.save(os.path.join(data_dir, f"{name}.output.0.npy"), array)
        data[name] = {"input_args": [], "input_kwargs": {}, "output": [
            {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [elements], "Max": float(array.max()),
             "Min": float(array.min()), "Mean": float(array.mean()), "Norm": float(np.linalg.norm(array)),
             "data_name": f"{name}.output.0.npy"}]}
    with open(os.path.join(folder, "dump.json"), "w") as f:
        f.write(json.dumps({"task": "tensor", "level": "L1", "framework": "mindspore", "dump_data_dir": data_dir,
                            "data": data}))
    return folder


def tensor_bench(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        target = write_tensor_dump(os.path.join(tmp, "t", "step0", "rank"), args.tensors, args.elements, 1)
        golden = write_tensor_dump(os.path.join(tmp, "g", "step0", "rank"), args.tensors, args.elements, 2)
        size = 2 * args.tensors * args.elements * 4
        start = time.perf_counter()
        compare(target, golden, os.path.join(tmp, "out"), quiet=True, workers=args.workers)
        elapsed = time.perf_counter() - start
    print(f"{args.tensors} tensors of {args.elements} float32 per side, {size / 1e6:.0f} MB of tensor files, "
          f"{args.workers or os.cpu_count()} worker(s): {elapsed:.2f} s, {size / 1e6 / elapsed:.0f} MB/s")
    return 0


def peak_memory(command: list) -> int:
    """Run `command`; the largest memory that it and its children held together, sampled every few
    milliseconds: the sum of their proportional set sizes (Pss: a page shared by a forked child counts once).
    Linux only."""
    import subprocess

    process, peak = subprocess.Popen(command), 0
    while process.poll() is None:
        peak = max(peak, sum(_pss(pid) for pid in _family(process.pid)))
        time.sleep(0.005)
    if process.returncode:
        raise SystemExit(process.returncode)
    return peak


def _family(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        children = []
    return [pid] + [p for c in children for p in _family(c)]


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--tensors", type=int, default=0, help="tensor mode: this many tensors per side")
    parser.add_argument("--elements", type=int, default=1_000_000, help="tensor mode: elements per tensor")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per CPU)")
    parser.add_argument("--memory", action="store_true", help="compare in a fresh process, and say the peak memory "
                        "of its processes (the time then includes the interpreter's start)")
    parser.add_argument("--repeat", type=int, default=5, help="compares timed (statistics mode): the median is "
                        "reported, a shared machine's noise being 20%% from one run to the next")
    args = parser.parse_args(argv)
    if args.tensors:
        return tensor_bench(args)
    with tempfile.TemporaryDirectory() as tmp:
        target = write_dump(os.path.join(tmp, "t", "step0", "rank"), args.records, 1, 1e-6)
        golden = write_dump(os.path.join(tmp, "g", "step0", "rank"), args.records, 2, 0.0)
        size = os.path.getsize(target) + os.path.getsize(golden)
        out = os.path.join(tmp, "out")
        times = []
        for _ in range(1 if args.memory else max(args.repeat, 1)):
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            if args.memory:  # in a fresh process: what making the dumps left here is not compare's
                peak = peak_memory([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); from "
                                    f"msprobe_lite.compare import compare; compare({target!r}, {golden!r}, {out!r}, "
                                    f"quiet=True, html=True, workers={args.workers})"])
            else:
                compare(target, golden, out, quiet=True, html=True, workers=args.workers)
            times.append(time.perf_counter() - start)
    elapsed = statistics.median(times)
    runs = f" (median of {len(times)}: {', '.join(f'{t:.2f}' for t in sorted(times))} s)" if len(times) > 1 else ""
    print(f"{args.records} records per side, {size / 1e6:.1f} MB of dump.json: {elapsed:.2f} s{runs}, "
          f"{args.records / elapsed:,.0f} records/s, {size / 1e6 / elapsed:.1f} MB/s")
    if args.memory:
        print(f"peak memory of compare's processes (Pss, the interpreter's start included): {peak / 1e6:.0f} MB, "
              f"{peak / size:.2f} times the dump.json pair")
    return 0


if __name__ == "__main__":
    sys.exit(main())
