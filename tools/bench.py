"""Overhead benchmark: a small transformer training step timed without the debugger and with each level.

Two sizes, as users meet them: `small` (d_model 64, 2 layers, seq 16, batch 4), where per-call overhead
dominates, and `big` (d_model 256, 4 layers, seq 128, batch 8), where tensor work dominates. The step
time includes start()/stop()/step(), i.e. writing the dump. AdamW's update runs inside start()/stop(), as
in a user's loop, so L1 also records the optimizer's operations.

The configurations of a size (without the debugger, then each mode) run in one process, interleaved: each
has its own model, optimizer and debugger, and they take turns in short blocks of steps, the order reversed
every block. On a shared machine whose speed moves within minutes, configurations run one after another
compare the machine's states as much as the debugger; interleaved, each factor compares steps timed side
by side. Tensor mode, whose writes (hundreds of MB a step) keep the disk busy after its steps, takes turns
only with steps without the debugger of its own, in a group after the others. `--fresh` runs each
configuration alone in a fresh process, one after another, as the reference tool must (its debugger is a
process-wide singleton that patches torch).
Prints a table of median step times and slowdown factors, records and dump size (KB) per step, and writes JSON.
The mean step time and the number of full garbage collections in the timed steps are printed beside the
median: a full collection of a process that imported torch is long, and how often one comes depends on how
many objects the debugger keeps alive within a step. The median does not show it; a long run's mean
(`--steps 600`) does (docs/performance.md).
Every configuration dumps into one scratch folder (`--dump-dir`, default the system's temporary folder),
removed only when all have run: removing a configuration's dump (thousands of files) right before the next
configuration starts would put the file system's work for it into that configuration's timed steps (each
step makes files of its own).

    .venv/bin/python tools/bench.py                      # both sizes, every mode
    .venv/bin/python tools/bench.py --sizes small --modes L1 --steps 20
    .venv/bin/python tools/bench.py --compile --modes L0 L1 mix   # the model under torch.compile (inductor)
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
DEFAULT_STEPS = {"small": 60, "big": 8}  # timed steps per configuration
DEFAULT_PER = {"small": 2, "big": 1}    # steps per block when interleaved
# mode -> (task, level, summary_mode, other statistics settings); None = no debugger. `list`: L1 narrowed to the
# linear calls, as a user narrows a dump once a first one has named the layer (a filtered-out call still counts)
MODES = {"off": None, "L0": ("statistics", "L0", "statistics", {}), "L1": ("statistics", "L1", "statistics", {}),
         "mix": ("statistics", "mix", "statistics", {}), "md5": ("statistics", "L1", "md5", {}),
         "list": ("statistics", "L1", "statistics", {"list": ["linear"]}),
         "tensor": ("tensor", "L1", "statistics", {})}
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


class Configuration:
    """One mode of one size: its own model, optimizer and batch (the same seed for every configuration, so
    each trains the same way) and its own debugger, dumping to a new folder in `dump_root`. A debugger's
    module hooks stay on its model between steps (by design, inactive), so configurations share no model:
    the step without the debugger runs on a model no debugger ever touched."""

    def __init__(self, size: str, mode: str, tool: str, dump_root: str, debugger_type=None):
        cfg = SIZES[size]
        self.size, self.mode, self.tool = size, mode, tool
        torch.manual_seed(0)
        # compiled: a class of its own per configuration, so that dynamo does not reuse the graphs another
        # configuration compiled (its cache is per code object, guarded on the module's type)
        model_class = type(f"GPT_{mode}", (GPT,), {}) if COMPILE[0] else GPT
        self.model = model_class(cfg["d"], cfg["layers"], cfg["seq"])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        if COMPILE[0]:  # the model compiled by inductor; the optimizer's step stays eager
            self.model = torch.compile(self.model)
        self.x = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
        self.y = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
        self.folder = tempfile.mkdtemp(prefix=f"{size}_{mode}_", dir=dump_root)
        self.debugger = None
        if MODES[mode] is not None:
            task, level, summary, settings = MODES[mode]
            config = {"task": task, "level": level, "dump_path": self.folder,
                      "statistics": {"summary_mode": summary, **settings}}
            with open(os.path.join(self.folder, "config.json"), "w") as f:
                json.dump(config, f)
            self.debugger = (debugger_type or debugger_class(tool))(os.path.join(self.folder, "config.json"))
        self.times: list = []
        self.cpu_times: list = []  # the training thread's own CPU time (time it was not running left out)
        self.full_collections = 0

    def step(self, timed: bool) -> None:
        """One training step; when `timed`, its times and the full collections that ran in it count."""
        before = FULL_COLLECTIONS[0]
        c0, t0 = time.thread_time(), time.perf_counter()
        train_step(self.model, self.opt, self.x, self.y, self.debugger)
        if timed:
            self.times.append(time.perf_counter() - t0)
            self.cpu_times.append(time.thread_time() - c0)
            self.full_collections += FULL_COLLECTIONS[0] - before

    def result(self) -> dict:
        out = {"tool": self.tool, "size": self.size, "mode": self.mode,
               "median_ms": statistics.median(self.times) * 1e3, "mean_ms": statistics.mean(self.times) * 1e3,
               "steps": len(self.times), "full_gc": self.full_collections}
        if self.debugger:
            last = last_rank_dir(self.folder)
            with open(os.path.join(last, "dump.json")) as f:
                out["records_per_step"] = len(json.load(f)["data"])
            out["bytes_per_step"] = sum(os.path.getsize(os.path.join(folder, n))
                                        for folder, _, names in os.walk(last) for n in names)
        return out


FULL_COLLECTIONS = [0]  # full garbage collections so far in this process
COMPILE = [False]  # --compile


def _count_full(phase, info) -> None:
    if phase == "start" and info["generation"] == 2:
        FULL_COLLECTIONS[0] += 1


WRITES_TENSORS = {"tensor"}  # modes that write hundreds of MB a step


def mode_groups(modes) -> list:
    """The modes interleaved together: the statistics modes in one group, each mode that writes tensors in a
    group of its own, with its own steps without the debugger (the disk's work for its writes would fall on
    whatever runs next to it)."""
    light = [m for m in modes if m not in WRITES_TENSORS]
    return ([light] if light else []) + [[m] for m in modes if m in WRITES_TENSORS]


def take_turns(configurations, blocks: int, per: int, warmup: int) -> None:
    """`warmup` untimed rounds of one step each, then `blocks` rounds of `per` timed steps of each
    configuration, the order reversed every round: the machine's slow and fast minutes fall on all of them
    alike (also tools/bench_ab.py's loop)."""
    gc.callbacks.append(_count_full)
    try:
        for i in range(warmup + blocks):
            timed = i >= warmup
            for configuration in configurations if i % 2 == 0 else configurations[::-1]:
                for _ in range(per if timed else 1):
                    configuration.step(timed)
    finally:
        gc.callbacks.remove(_count_full)


def run_interleaved(size: str, modes, steps: int, per: int, warmup: int, dump_root: str) -> list:
    """Every configuration of `size` (without the debugger first) in this process, taking turns in blocks of
    `per` steps: each factor compares steps timed side by side. Returns one result per configuration, with
    `slowdown` against the first."""
    configurations = [Configuration(size, mode, "msprobe_lite", dump_root) for mode in ["off", *modes]]
    take_turns(configurations, -(-steps // per), per, warmup)
    rows = [c.result() for c in configurations]
    for row in rows[1:]:
        row["slowdown"] = row["median_ms"] / rows[0]["median_ms"]
    return rows


def run(size: str, mode: str, steps: int, warmup: int, tool: str = "msprobe_lite",
        dump_root: str | None = None) -> dict:
    """One configuration alone (the caller runs it in a fresh process: `--fresh`, and the reference tool,
    whose debugger is a process-wide singleton that patches torch). Its dump goes to a new folder in
    `dump_root`, left there (the caller removes the root at the end), or, without one, to a temporary folder
    removed on return."""
    if dump_root is None:
        with tempfile.TemporaryDirectory() as root:
            return run(size, mode, steps, warmup, tool, root)
    configuration = Configuration(size, mode, tool, dump_root)
    gc.callbacks.append(_count_full)
    try:
        for i in range(warmup + steps):
            configuration.step(i >= warmup)
    finally:
        gc.callbacks.remove(_count_full)
    return configuration.result()


def in_fresh_process(size: str, mode: str, steps: int, args, dump_root: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", size, mode, "--steps", str(steps),
           "--warmup", str(args.warmup), "--tool", args.tool, "--dump-root", dump_root] + (
               ["--compile"] if args.compile else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--modes", nargs="+", default=[m for m in MODES if m != "off"],
                        choices=[m for m in MODES if m != "off"])
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps per configuration (default: %s)" % ", ".join(
                            f"{n} {size}" for size, n in DEFAULT_STEPS.items()))
    parser.add_argument("--per", type=int, default=None,
                        help="steps per block when interleaved (default: %s)" % ", ".join(
                            f"{n} {size}" for size, n in DEFAULT_PER.items()))
    parser.add_argument("--fresh", action="store_true",
                        help="each configuration in a fresh process, one after another, instead of interleaved "
                             "in one process (always so for --tool msprobe)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default="bench_results.json")
    parser.add_argument("--dump-dir", default=None,
                        help="where the scratch folder for the dumps is made (default: the system's temporary folder)")
    parser.add_argument("--one", nargs=2, metavar=("SIZE", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--dump-root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true",
                        help="the model under torch.compile (inductor), with and without the debugger")
    parser.add_argument("--tool", default="msprobe_lite", choices=["msprobe_lite", "msprobe"],
                        help="msprobe = the reference tool, for a side-by-side figure")
    args = parser.parse_args(argv)
    COMPILE[0] = args.compile
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
            if not args.fresh and args.tool == "msprobe_lite":
                for group in mode_groups(args.modes):
                    rows += run_interleaved(size, group, steps, args.per or DEFAULT_PER[size], args.warmup, root)
                    os.sync()  # what a group wrote reaches the disk before the next group is timed
                continue
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
    meta = {"tool": args.tool, "interleaved": not args.fresh and args.tool == "msprobe_lite", "compile": args.compile,
            "torch": torch.__version__, "threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count()}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
