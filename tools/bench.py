"""Overhead benchmark: a small transformer training step timed without the debugger and with each level.

Two sizes, as users meet them: `small` (d_model 64, 2 layers, seq 16, batch 4), where per-call overhead
dominates, and `big` (d_model 256, 4 layers, seq 128, batch 8), where tensor work dominates. Each
configuration runs in a fresh process (the reference's debugger is a process-wide singleton); the step
time includes start()/stop()/step(), i.e. writing the dump. AdamW's update runs inside start()/stop(), as
in a user's loop, so L1 also records the optimizer's operations.
Prints a table of median step times and slowdown factors, records and dump size (KB) per step, and writes JSON.
The mean step time and the number of full garbage collections in the timed steps are printed beside the
median: a full collection of a process that imported torch takes 100 to 170 ms here, and how often one comes
depends on how many objects the debugger keeps alive within a step. The median does not show it; a long
run's mean does (`--steps 600`: at small L1, one comes about every 200 steps).
Every configuration dumps into one scratch folder (`--dump-dir`, default the system's temporary folder),
removed only when all have run: removing a configuration's dump (thousands of files) right before the next
configuration starts would put the file system's work for it into that configuration's timed steps (each
step makes files of its own).

    .venv/bin/python tools/bench.py                      # both sizes, every mode
    .venv/bin/python tools/bench.py --sizes small --modes L1 --steps 20
    REFVENV/bin/python tools/bench.py --tool msprobe     # the reference tool (mindstudio-probe), same steps
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {"small": dict(d=64, layers=2, seq=16, batch=4), "big": dict(d=256, layers=4, seq=128, batch=8)}
DEFAULT_STEPS = {"small": 30, "big": 6}  # timed steps per configuration
# mode -> (task, level, summary_mode); None = no debugger
MODES = {"off": None, "L0": ("statistics", "L0", "statistics"), "L1": ("statistics", "L1", "statistics"),
         "mix": ("statistics", "mix", "statistics"), "md5": ("statistics", "L1", "md5"),
         "tensor": ("tensor", "L1", "statistics")}
VOCAB = 512


class Attention(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (d // self.heads) ** 0.5)
        att = att.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, d, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def train_step(model, opt, x, y, debugger=None) -> None:
    """One training step as a user writes it, the debugger's three calls around it when given."""
    if debugger:
        debugger.start(model=model)
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    if debugger:
        debugger.stop()
        debugger.step()


def debugger_class(tool: str):
    if tool == "msprobe":
        from msprobe.pytorch import PrecisionDebugger
    else:
        from msprobe_lite.pytorch import PrecisionDebugger
    return PrecisionDebugger


def last_rank_dir(dump_path: str) -> str:
    """The rank folder of the last step written: rank/ for msprobe_lite, proc<pid>/ for the reference."""
    step = max((n for n in os.listdir(dump_path) if n.startswith("step")), key=lambda n: int(n[4:]))
    (name,) = [n for n in os.listdir(os.path.join(dump_path, step))]
    return os.path.join(dump_path, step, name)


def run(size: str, mode: str, steps: int, warmup: int, tool: str = "msprobe_lite",
        dump_root: str | None = None) -> dict:
    """One configuration's timings; its dump goes to a new folder in `dump_root`, left there (the caller
    removes the root at the end), or, without one, to a temporary folder removed on return."""
    if dump_root is None:
        with tempfile.TemporaryDirectory() as root:
            return run(size, mode, steps, warmup, tool, root)
    cfg = SIZES[size]
    torch.manual_seed(0)
    model = GPT(cfg["d"], cfg["layers"], cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
    y = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
    tmp = tempfile.mkdtemp(prefix=f"{size}_{mode}_", dir=dump_root)
    debugger = None
    if MODES[mode] is not None:
        task, level, summary = MODES[mode]
        config = {"task": task, "level": level, "dump_path": tmp, "statistics": {"summary_mode": summary}}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f)
        debugger = debugger_class(tool)(os.path.join(tmp, "config.json"))
    times, full_collections = [], []

    def count_full(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_collections.append(1)
    gc.callbacks.append(count_full)
    try:
        for i in range(warmup + steps):
            if i == warmup:
                full_collections.clear()
            t0 = time.perf_counter()
            train_step(model, opt, x, y, debugger)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        gc.callbacks.remove(count_full)
    result = {"tool": tool, "size": size, "mode": mode, "median_ms": statistics.median(times) * 1e3,
              "mean_ms": statistics.mean(times) * 1e3, "full_gc": len(full_collections)}
    if debugger:
        last = last_rank_dir(tmp)
        with open(os.path.join(last, "dump.json")) as f:
            result["records_per_step"] = len(json.load(f)["data"])
        result["bytes_per_step"] = sum(os.path.getsize(os.path.join(folder, n))
                                       for folder, _, names in os.walk(last) for n in names)
    return result


def in_fresh_process(size: str, mode: str, steps: int, args, dump_root: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", size, mode, "--steps", str(steps),
           "--warmup", str(args.warmup), "--tool", args.tool, "--dump-root", dump_root]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--modes", nargs="+", default=[m for m in MODES if m != "off"],
                        choices=[m for m in MODES if m != "off"])
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 30 small, 6 big)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="bench_results.json")
    parser.add_argument("--dump-dir", default=None,
                        help="where the scratch folder for the dumps is made (default: the system's temporary folder)")
    parser.add_argument("--one", nargs=2, metavar=("SIZE", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--dump-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="msprobe_lite", choices=["msprobe_lite", "msprobe"],
                        help="msprobe = the reference tool, for a side-by-side figure")
    args = parser.parse_args(argv)
    if args.one:
        size, mode = args.one
        steps = args.steps or DEFAULT_STEPS[size]
        print(json.dumps(run(size, mode, steps, args.warmup, args.tool, args.dump_root)))
        return 0
    rows = []
    root = tempfile.mkdtemp(prefix="msprobe_lite_bench_", dir=args.dump_dir)
    try:
        for size in args.sizes:
            steps = args.steps or DEFAULT_STEPS[size]
            base = in_fresh_process(size, "off", steps, args, root)
            rows.append(base)
            for mode in args.modes:
                row = in_fresh_process(size, mode, steps, args, root)
                row["slowdown"] = row["median_ms"] / base["median_ms"]
                rows.append(row)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'size':<6} {'mode':<6} {'median ms':>10} {'slowdown':>9} {'mean ms':>9} {'full GCs':>9} "
          f"{'records/step':>13} {'KB/step':>9}")
    for r in rows:
        print(f"{r['size']:<6} {r['mode']:<6} {r['median_ms']:>10.2f} {r.get('slowdown', 1.0):>8.2f}x "
              f"{r['mean_ms']:>9.2f} {r['full_gc']:>9} {r.get('records_per_step', 0):>13} "
              f"{r.get('bytes_per_step', 0) / 1024:>9.1f}")
    meta = {"tool": args.tool, "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
