"""What one captured API call costs, part by part: the per-call view behind tools/bench.py's small step.

A loop of `torch.add(x, b)` on 4x16 float32 tensors (each result feeds the next call, as in a model), timed
without the debugger, under a do-nothing TorchFunctionMode (the price of PyTorch calling Python for every
call), and at L1 with config variants that drop one part each: stacks (`extra_info: false`), inputs
(`statistics.data_mode: ["output"]`), outputs (`["input"]`). The difference between the variants is what
that part costs per call. Writing is outside the loop (stop()/step() are not timed); the tensors do not
require grad unless `--grad` (then each call also registers a gradient hook, torch's `register_hook`). One
more row runs the L1 loop under `torch.no_grad()`, as an optimizer's calls run: with gradients recorded,
each captured call asks Python whether to hook its tensors, even when none requires grad.
Best of `--repeats` loops of `--calls` calls, in microseconds per call.

    .venv/bin/python tools/bench_calls.py
    .venv/bin/python tools/bench_calls.py --grad
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from msprobe_lite.pytorch import PrecisionDebugger  # noqa: E402

VARIANTS = {"L1": {}, "L1 without stacks": {"extra_info": False},
            "L1 without inputs": {"statistics": {"data_mode": ["output"]}},
            "L1 without outputs": {"statistics": {"data_mode": ["input"]}}}


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _loop(n: int, grad: bool) -> float:
    b = torch.randn(4, 16)
    x = torch.randn(4, 16).requires_grad_(grad)
    t0 = time.perf_counter()
    for _ in range(n):
        x = torch.add(x, b)
    return (time.perf_counter() - t0) / n * 1e6


def _best(around, args) -> float:
    """Best of the repeats, each loop inside `around` (enter, exit): the floor, not the machine's noise."""
    times = []
    for _ in range(args.repeats):
        enter, leave = around
        enter()
        times.append(_loop(args.calls, args.grad))
        leave()
    return min(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--grad", action="store_true", help="inputs require grad: every call hooks its output")
    args = parser.parse_args(argv)
    gc.disable()  # young collections land on random calls; the step benchmark shows their cost
    rows = {"off": _best((lambda: None, lambda: None), args)}
    mode = _PassThrough()
    rows["pass-through mode"] = _best((mode.__enter__, lambda: mode.__exit__(None, None, None)), args)
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VARIANTS.items():
            path = os.path.join(tmp, f"{len(rows)}.json")
            with open(path, "w") as f:
                json.dump({"task": "statistics", "level": "L1", "dump_path": os.path.join(tmp, str(len(rows))),
                           **extra}, f)
            d = PrecisionDebugger(path)
            rows[name] = _best((d.start, lambda d=d: (d.stop(), d.step())), args)
            if name == "L1":
                with torch.no_grad():
                    rows["L1 under torch.no_grad()"] = _best((d.start, lambda d=d: (d.stop(), d.step())), args)
    base = rows["off"]
    print(f"{'variant':<36} {'us/call':>8} {'extra':>7}")
    for name, t in rows.items():
        print(f"{name:<36} {t:>8.2f} {t - base:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
