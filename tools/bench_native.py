"""What each C extension saves: tools/bench.py's training step with every C route, with each extension left out
(its Python route instead), and with none, all in one process, interleaved (tools/bench_ab.py's way).

Each variant is this tree's package copied under another name with MSPROBE_LITE_PURE_PYTHON fixed to the
extension left out (core/native.py). Prints per variant the step's median and what leaving the extension out
adds, as a share of the step with every C route: the table in docs/performance.md.

    .venv/bin/python tools/bench_native.py                          # small L1
    .venv/bin/python tools/bench_native.py --size big --level L1 --blocks 8 --per 1
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench  # noqa: E402
import bench_ab  # noqa: E402
from msprobe_lite.core.native import EXTENSIONS  # noqa: E402


def variant(scratch: str, left_out: str) -> str:
    """A checkout-like folder whose package leaves `left_out` out whatever the environment says."""
    folder = os.path.join(scratch, "variant_" + left_out.replace(",", "_"))
    shutil.copytree(os.path.join(ROOT, "msprobe_lite"), os.path.join(folder, "msprobe_lite"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    native = os.path.join(folder, "msprobe_lite", "core", "native.py")
    with open(native) as f:
        text = f.read()
    text, n = re.subn(r"^_SETTING = .*$", f"_SETTING = {left_out!r}", text, flags=re.M)
    assert n == 1, "core/native.py: _SETTING not found"
    with open(native, "w") as f:
        f.write(text)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="L1", choices=["L0", "L1", "mix"])
    parser.add_argument("--size", default="small", choices=sorted(bench.SIZES))
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--per", type=int, default=2, help="steps per block")
    args = parser.parse_args(argv)
    from msprobe_lite.pytorch import PrecisionDebugger
    left_outs = list(EXTENSIONS) + ["1"]
    with tempfile.TemporaryDirectory() as scratch:
        builds = [(name, bench_ab.load_base(variant(scratch, name), scratch, i)) for i, name in enumerate(left_outs)]
        runs = {"off": bench.Configuration(args.size, "off", "msprobe_lite", scratch),
                "all C": bench.Configuration(args.size, args.level, "msprobe_lite", scratch, PrecisionDebugger)}
        runs.update((name, bench.Configuration(args.size, args.level, "msprobe_lite", scratch, cls))
                    for name, cls in builds)
        bench.take_turns(list(runs.values()), args.blocks, args.per, warmup=3)
    median = {name: statistics.median(run.times) * 1e3 for name, run in runs.items()}
    off, every = median["off"], median["all C"]
    print(f"{args.size} {args.level}, {args.blocks} blocks of {args.per} steps: without the debugger {off:.2f} ms, "
          f"with every C route {every:.2f} ms ({every / off:.2f}x)")
    print(f"  {'left out':<14} {'step ms':>8} {'x off':>6} {'saves':>7}")
    for name in left_outs:
        label = "every one" if name == "1" else name
        print(f"  {label:<14} {median[name]:8.2f} {median[name] / off:6.2f} {(median[name] - every) / every:7.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
