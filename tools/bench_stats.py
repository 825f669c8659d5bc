"""The statistics kernel alone: microseconds to read one float32 tensor right after a PyTorch operator wrote
it, by the one-pass kernel on the calling thread (core/_fast_stats.c) and by PyTorch's own reductions
(`torch.aminmax`, `sum`, `linalg.vector_norm`, each on PyTorch's threads): why the kernel stays one-threaded.

Each figure is the median over `--repeat` runs of (operator + statistics) minus the median of the operator
alone, so the tensor is where the operator left it (in the caches of the cores that wrote it), as in a
training step. Three rounds per size show how far the figures move on a shared machine.

    .venv/bin/python tools/bench_stats.py
    .venv/bin/python tools/bench_stats.py --sizes-kb 1024 4096 --rounds 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from msprobe_lite.core._fast_stats import stats  # noqa: E402


def median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def torch_stats(t):
    low, high = torch.aminmax(t)
    return high.item(), low.item(), t.sum().item() / t.numel(), torch.linalg.vector_norm(t).item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-kb", type=int, nargs="+", default=[128, 132, 256, 512, 1024, 2048, 4096, 16384, 131072])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=400, help="runs per median (fewer for large tensors)")
    args = parser.parse_args(argv)
    print(f"torch threads {torch.get_num_threads()}")
    print(f"{'tensor':>10}  kernel / torch (µs), one pair per round")
    for kb in args.sizes_kb:
        x = torch.randn(kb * 256)
        y = torch.empty_like(x)
        values = y.numpy()

        def op():
            torch.mul(x, 1.0001, out=y)

        repeat = max(20, min(args.repeat, args.repeat * 4096 // kb))
        pairs = []
        for _ in range(args.rounds):
            base = median_us(op, repeat)
            alone = median_us(lambda: (op(), stats(values, "float32")), repeat) - base
            library = median_us(lambda: (op(), torch_stats(y)), repeat) - base
            pairs.append(f"{alone:7.0f} / {library:<7.0f}")
        size = f"{kb // 1024} MB" if kb >= 1024 else f"{kb} KB"
        print(f"{size:>10}  " + "  ".join(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
