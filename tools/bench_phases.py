"""Where a step's extra time goes: tools/bench.py's training step timed phase by phase, without the debugger
and with it, the two configurations taking turns (as in bench.py, the order reversed every block).

    .venv/bin/python tools/bench_phases.py                     # small step, L1
    .venv/bin/python tools/bench_phases.py --mode mix --steps 300
    .venv/bin/python tools/bench_phases.py --empty-api-list    # L1 recording nothing: the mode's own floor

Prints the median of each phase (start, forward, backward, optimizer, stop, step) and the extra per phase.
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402

PHASES = ("start", "forward", "backward", "optimizer", "stop", "step")


def timed_step(c, times) -> None:
    d, model, opt = c.debugger, c.model, c.opt
    t = [time.perf_counter()]
    if d:
        d.start(model=model)
    t.append(time.perf_counter())
    loss = F.cross_entropy(model(c.x).reshape(-1, bench.VOCAB), c.y.reshape(-1))
    t.append(time.perf_counter())
    loss.backward()
    t.append(time.perf_counter())
    opt.step()
    opt.zero_grad()
    t.append(time.perf_counter())
    if d:
        d.stop()
    t.append(time.perf_counter())
    if d:
        d.step()
    t.append(time.perf_counter())
    if times is not None:
        for phase, a, b in zip(PHASES, t, t[1:]):
            times[phase].append(b - a)
        times["total"].append(t[-1] - t[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(bench.SIZES), default="small")
    parser.add_argument("--mode", choices=["L0", "L1", "mix"], default="L1")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per configuration")
    parser.add_argument("--empty-api-list", action="store_true",
                        help="capture with an empty API list: every call passes through, none is recorded")
    parser.add_argument("--dump-dir", default=None, help="where the dumps go while it runs (removed at the end)")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="msprobe_lite_phases_", dir=args.dump_dir)
    off = bench.Configuration(args.size, "off", "msprobe_lite", root)
    if args.empty_api_list:
        from msprobe_lite.pytorch import api_capture
        original = api_capture.load_api_list
        api_capture.load_api_list = lambda path=api_capture.API_LIST: ({}, ())
        on = bench.Configuration(args.size, args.mode, "msprobe_lite", root)
        api_capture.load_api_list = original
    else:
        on = bench.Configuration(args.size, args.mode, "msprobe_lite", root)
    times = {c: collections.defaultdict(list) for c in (off, on)}
    for i in range(args.steps // 2 + 10):
        for c in ((off, on) if i % 2 else (on, off)):
            for _ in range(2):
                timed_step(c, times[c] if i >= 10 else None)
    label = args.mode + (" (empty API list)" if args.empty_api_list else "")
    print(f"{args.size} step, median of {len(times[off]['total'])} steps: without the debugger, {label}, extra (ms)")
    for phase in PHASES + ("total",):
        a, b = statistics.median(times[off][phase]) * 1e3, statistics.median(times[on][phase]) * 1e3
        print(f"  {phase:10s} {a:8.3f} {b:8.3f} {b - a:8.3f}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
