"""Builds of msprobe_lite timed in one process, on tools/bench.py's training step: the way to tell whether a
change helps on a machine whose speed moves.

On the shared 2-core VM these figures come from, the step without the debugger moved between 6 and 15 ms
within minutes, so fresh-process runs of two versions (`bench.py --one`) compare machine states as much as
versions. Here the builds live in one process: each other version's package is copied under another name
(`msprobe_base0`, ...; the package imports itself relatively, and its C extensions come along, built in
place), each build gets its own debugger, and blocks of steps without the debugger, with the other builds'
and with this tree's alternate, their order reversed every block. Short blocks (2 steps) and many of them
spread the machine's slow and fast minutes evenly over the builds: with blocks of 8 steps, two runs of the
same pair of builds disagreed on which was faster (the big step, bound by memory bandwidth that other jobs
share, still disagrees with blocks of 2: run it several times). Medians of each; the extra time is on - off, in wall
time and in the training thread's own CPU time (`time.thread_time`: time the thread was not running, taken
by the host or other processes, left out).

    git worktree add /tmp/base HEAD~3
    (py=$PWD/.venv/bin/python; cd /tmp/base && $py -c "from setuptools import setup; setup()" build_ext --inplace)
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level L1
    .venv/bin/python tools/bench_ab.py --base /tmp/base --base /tmp/other --level mix
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level mix --size big --blocks 6 --per 2
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench  # noqa: E402


def load_base(base: str, scratch: str, index: int):
    """Another build's PrecisionDebugger, imported as `msprobe_base{index}` from a copy of its package."""
    name = f"msprobe_base{index}"
    shutil.copytree(os.path.join(base, "msprobe_lite"), os.path.join(scratch, name))
    if scratch not in sys.path:
        sys.path.insert(0, scratch)
    return importlib.import_module(f"{name}.pytorch").PrecisionDebugger


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, action="append",
                        help="a checkout of another version, C extensions built in place (repeatable)")
    parser.add_argument("--level", default="L1", choices=["L0", "L1", "mix"])
    parser.add_argument("--size", default="small", choices=sorted(bench.SIZES))
    parser.add_argument("--blocks", type=int, default=80)
    parser.add_argument("--per", type=int, default=2, help="steps per block")
    args = parser.parse_args(argv)
    from msprobe_lite.pytorch import PrecisionDebugger
    cfg = bench.SIZES[args.size]
    torch.manual_seed(0)
    model = bench.GPT(cfg["d"], cfg["layers"], cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, bench.VOCAB, (cfg["batch"], cfg["seq"]))
    y = torch.randint(0, bench.VOCAB, (cfg["batch"], cfg["seq"]))
    with tempfile.TemporaryDirectory() as scratch:
        debuggers = {"off": None}
        builds = [(f"base{i}" if len(args.base) > 1 else "base", load_base(base, scratch, i))
                  for i, base in enumerate(args.base)] + [("this", PrecisionDebugger)]
        for name, cls in builds:
            path = os.path.join(scratch, f"{name}.json")
            with open(path, "w") as f:
                json.dump({"task": "statistics", "level": args.level, "dump_path": os.path.join(scratch, name)}, f)
            debuggers[name] = cls(path)
        times = {name: [] for name in debuggers}
        cpu = {name: [] for name in debuggers}
        names = list(debuggers)
        for i in range(3 + args.blocks):
            for name in names if i % 2 == 0 else names[::-1]:
                for _ in range(args.per if i >= 3 else 1):  # three rounds of one step each: warm-up
                    c0, t0 = time.thread_time(), time.perf_counter()
                    bench.train_step(model, opt, x, y, debuggers[name])
                    if i >= 3:
                        times[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.thread_time() - c0)
    off, cpu_off = statistics.median(times["off"]) * 1e3, statistics.median(cpu["off"]) * 1e3
    print(f"{args.size} {args.level}, {args.blocks} blocks of {args.per} steps: off {off:.2f} ms "
          f"(training thread's CPU {cpu_off:.2f} ms)")
    for name in names[1:]:
        on, cpu_on = statistics.median(times[name]) * 1e3, statistics.median(cpu[name]) * 1e3
        print(f"  {name:<5} {on:8.2f} ms  extra {on - off:7.2f} ms  {on / off:5.2f}x   "
              f"CPU extra {cpu_on - cpu_off:7.2f} ms  {cpu_on / cpu_off:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
