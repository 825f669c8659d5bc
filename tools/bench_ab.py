"""Two builds of msprobe_lite timed in one process, on tools/bench.py's training step: the way to tell
whether a change helps on a machine whose speed moves.

On the shared 2-core VM these figures come from, the step without the debugger moved between 6 and 15 ms
within minutes, so fresh-process runs of two versions (`bench.py --one`) compare machine states as much as
versions. Here both builds live in one process: the other version's package is copied under another name
(`msprobe_base`; the package imports itself relatively, and its C extensions come along, built in place),
each build gets its own debugger, and blocks of steps without the debugger, with the other build's and with
this tree's alternate, their order reversed every block. Medians of each; the extra time is on - off.

    git worktree add /tmp/base HEAD~3
    (py=$PWD/.venv/bin/python; cd /tmp/base && $py -c "from setuptools import setup; setup()" build_ext --inplace)
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level L1
    .venv/bin/python tools/bench_ab.py --base /tmp/base --level mix --size big --blocks 4 --per 3
"""
from __future__ import annotations

import argparse
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


def load_base(base: str, scratch: str):
    """The other build's PrecisionDebugger, imported as `msprobe_base` from a copy of its package."""
    shutil.copytree(os.path.join(base, "msprobe_lite"), os.path.join(scratch, "msprobe_base"))
    sys.path.insert(0, scratch)
    from msprobe_base.pytorch import PrecisionDebugger
    return PrecisionDebugger


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="a checkout of the other version, C extensions built in place")
    parser.add_argument("--level", default="L1", choices=["L0", "L1", "mix"])
    parser.add_argument("--size", default="small", choices=sorted(bench.SIZES))
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--per", type=int, default=8, help="steps per block")
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
        for name, cls in (("base", load_base(args.base, scratch)), ("this", PrecisionDebugger)):
            path = os.path.join(scratch, f"{name}.json")
            with open(path, "w") as f:
                json.dump({"task": "statistics", "level": args.level, "dump_path": os.path.join(scratch, name)}, f)
            debuggers[name] = cls(path)
        times = {name: [] for name in debuggers}
        names = list(debuggers)
        for i in range(3 + args.blocks):
            for name in names if i % 2 == 0 else names[::-1]:
                for _ in range(args.per if i >= 3 else 1):  # three rounds of one step each: warm-up
                    t0 = time.perf_counter()
                    bench.train_step(model, opt, x, y, debuggers[name])
                    if i >= 3:
                        times[name].append(time.perf_counter() - t0)
    off = statistics.median(times["off"]) * 1e3
    print(f"{args.size} {args.level}, {args.blocks} blocks of {args.per} steps: off {off:.2f} ms")
    for name in names[1:]:
        on = statistics.median(times[name]) * 1e3
        print(f"  {name:<5} {on:8.2f} ms  extra {on - off:7.2f} ms  {on / off:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
