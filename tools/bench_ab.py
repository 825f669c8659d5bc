"""Builds of msprobe_lite timed in one process, on tools/bench.py's training step: the way to tell whether a
change helps on a machine whose speed moves.

On a shared machine the step's speed moves within minutes, so fresh-process runs of two versions
(`bench.py --one`) compare machine states as much as versions. Here the builds live in one process: each
other version's package is copied under another name (`msprobe_base0`, ...; the package imports itself
relatively, and its C extensions come along, built in place), each build gets its own debugger and its own
copy of the model (`bench.Configuration`: a debugger's module hooks stay on its model), and blocks of steps
without the debugger, with the other builds' and with this tree's alternate, their order reversed every
block. Short blocks (2 steps) and many of them spread the machine's slow and fast minutes evenly over the
builds; the big step, bound by memory bandwidth that other jobs share, needs several runs. Medians of each;
the extra time is on - off, in wall time and in the training thread's own CPU time (`time.thread_time`:
time the thread was not running, taken by the host or other processes, left out).

    git worktree add /tmp/base HEAD~3
    (py=$PWD/.venv/bin/python; cd /tmp/base && $py -c "from setuptools import setup; setup()" build_ext --inplace)
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level L1
    .venv/bin/python tools/bench_ab.py --base /tmp/base --base /tmp/other --level mix
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level mix --size big --blocks 6 --per 2
"""
from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

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
    parser.add_argument("--level", default="L1", choices=["L0", "L1", "mix", "md5", "list"],
                        help="a mode of tools/bench.py")
    parser.add_argument("--size", default="small", choices=sorted(bench.SIZES))
    parser.add_argument("--blocks", type=int, default=80)
    parser.add_argument("--per", type=int, default=2, help="steps per block")
    args = parser.parse_args(argv)
    from msprobe_lite.pytorch import PrecisionDebugger
    with tempfile.TemporaryDirectory() as scratch:
        builds = [(f"base{i}" if len(args.base) > 1 else "base", load_base(base, scratch, i))
                  for i, base in enumerate(args.base)] + [("this", PrecisionDebugger)]
        runs = {"off": bench.Configuration(args.size, "off", "msprobe_lite", scratch)}
        runs.update((name, bench.Configuration(args.size, args.level, "msprobe_lite", scratch, cls))
                    for name, cls in builds)
        bench.take_turns(list(runs.values()), args.blocks, args.per, warmup=3)
    off, cpu_off = (statistics.median(t) * 1e3 for t in (runs["off"].times, runs["off"].cpu_times))
    print(f"{args.size} {args.level}, {args.blocks} blocks of {args.per} steps: off {off:.2f} ms "
          f"(training thread's CPU {cpu_off:.2f} ms)")
    for name, run in list(runs.items())[1:]:
        on, cpu_on = (statistics.median(t) * 1e3 for t in (run.times, run.cpu_times))
        print(f"  {name:<5} {on:8.2f} ms  extra {on - off:7.2f} ms  {on / off:5.2f}x   "
              f"CPU extra {cpu_on - cpu_off:7.2f} ms  {cpu_on / cpu_off:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
