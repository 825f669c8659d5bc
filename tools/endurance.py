"""Endurance figures for docs/reliability.md: memory over many steps, memory and write time of a long step.

    .venv/bin/python tools/endurance.py                        # both runs, the issue's sizes
    .venv/bin/python tools/endurance.py --steps 200 --records 20000   # quicker
    .venv/bin/python tools/endurance.py --only steps           # or --only long

`steps`: the small transformer of tools/bench.py trained N steps at level mix, with a step filter that selects
three of them (the first, the middle, the last, so the hooks stay installed throughout), and the same loop
without the debugger. RSS and the count of live Python objects after the first dumped step and every N/10
steps; the growth from the first mark to the last is what the debugger keeps, and should be ~0.

`long`: L1 steps of R small API calls (`torch.add` twice per iteration, the second on the first's output),
so one step holds R records. Step A: RSS per record while collecting, then `stop()`: its time against a
plain `write_step()` of the same records (what the write itself costs), and the RSS peak while writing.
Step B, under tracemalloc: the Python heap per record, against the size of the records themselves
(summaries, data dicts, stack and construct entries, counters: the "compact record").

Each run is a fresh process (memory figures of one must not carry into the other). Linux only (/proc).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def rss() -> int:
    """Resident set size of this process, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Samples RSS on a thread every millisecond; `peak` is the largest seen."""

    def __init__(self):
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def deep_size(obj, seen: set) -> int:
    """Bytes of `obj` and everything it holds (objects counted once across calls sharing `seen`)."""
    if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(deep_size(v, seen) for v in obj)
    for slot in getattr(type(obj), "__slots__", ()):
        size += deep_size(getattr(obj, slot, None), seen)
    return size


# -- 1,000 steps ---------------------------------------------------------------------------------------------------
def run_steps(steps: int, with_debugger: bool) -> dict:
    import torch
    from bench import GPT, SIZES, VOCAB, train_step

    cfg = SIZES["small"]
    torch.manual_seed(0)
    model = GPT(cfg["d"], cfg["layers"], cfg["seq"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
    y = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]))
    selected = [0, steps // 2, steps - 1]
    marks, every = [], max(1, steps // 10)
    with tempfile.TemporaryDirectory() as tmp:
        debugger = None
        if with_debugger:
            from msprobe_lite.pytorch import PrecisionDebugger
            debugger = PrecisionDebugger(dump_path=tmp, level="mix", task="statistics", step=selected)
        t0 = time.perf_counter()
        for i in range(steps):
            train_step(model, opt, x, y, debugger)
            if i == 0 or (i + 1) % every == 0:
                gc.collect()
                marks.append({"step": i + 1, "rss_mb": rss() / 2**20, "objects": len(gc.get_objects())})
        elapsed = time.perf_counter() - t0
        dumped = sorted(os.listdir(tmp)) if debugger else []
    first, last = marks[0], marks[-1]
    return {"run": "steps", "debugger": with_debugger, "steps": steps, "selected": selected, "dumped": dumped,
            "seconds": elapsed, "marks": marks, "rss_growth_mb": last["rss_mb"] - first["rss_mb"],
            "object_growth": last["objects"] - first["objects"]}


# -- one long L1 step ----------------------------------------------------------------------------------------------
def run_long(records: int) -> dict:
    import torch

    from msprobe_lite.core import writer
    from msprobe_lite.pytorch import PrecisionDebugger

    with tempfile.TemporaryDirectory() as tmp:
        debugger = PrecisionDebugger(dump_path=tmp, level="L1", task="statistics")
        session = debugger.session
        x = torch.randn(16)

        def one_step():
            debugger.start()
            t0 = time.perf_counter()
            for _ in range(records):
                y = torch.add(x, 1e-3)
                y = torch.add(y, 1e-3)   # each call's output is a new tensor, its input the last one's output
            return time.perf_counter() - t0

        records //= 2                          # two calls per iteration
        debugger.start()                       # warm-up step: stacks formatted, caches and imports made
        for _ in range(100):
            torch.add(x, 1e-3)
        debugger.stop()
        debugger.step()
        gc.collect()

        # step A: RSS per record, then stop() against the write itself, and the RSS peak while writing
        rss0 = rss()
        collect_s = one_step()
        gc.collect()
        rss1 = rss()
        assert len(session.records) == 2 * records, len(session.records)
        with PeakRss() as peak:
            t0 = time.perf_counter()
            debugger.stop()                    # writes the step
            stop_s = time.perf_counter() - t0
        folder = session.folder()
        size = os.path.getsize(os.path.join(folder, "dump.json"))
        records_list = session._records_to_write()
        header, stacks, construct = session.header(), session.stacks.to_json(), session.construct
        t0 = time.perf_counter()               # the write itself: the same content, written again elsewhere
        writer.write_step(os.path.join(tmp, "again"), header, records_list, stacks, construct)
        write_s = time.perf_counter() - t0
        debugger.step()
        with open(os.path.join(folder, "dump.json")) as f:
            written = len(json.load(f)["data"])
        del records_list, stacks, construct
        gc.collect()

        # step B: the Python heap per record (tracemalloc) against the records' own size
        tracemalloc.start()
        one_step()
        gc.collect()
        traced, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        seen: set = set()
        compact = sum(deep_size(r, seen) for r in session.records.values())
        compact += deep_size(session.stacks.__dict__, seen) + deep_size(session.construct, seen)
        compact += deep_size(session.counters, seen) + deep_size(session.filter.__dict__, seen)
        debugger.stop()
        debugger.step()
    n = 2 * records
    return {"run": "long", "records": n, "written": written, "collect_s": collect_s,
            "us_per_record": collect_s / n * 1e6,
            "traced_bytes_per_record": traced / n, "compact_bytes_per_record": compact / n,
            "rss_bytes_per_record": (rss1 - rss0) / n,
            "stop_s": stop_s, "write_s": write_s, "stop_over_write": stop_s / write_s,
            "dump_json_mb": size / 2**20, "rss_before_write_mb": rss1 / 2**20,
            "rss_peak_while_writing_mb": peak.peak / 2**20}


# -- driver ----------------------------------------------------------------------------------------------------------
def fresh(args: list) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--only", choices=["steps", "long"])
    parser.add_argument("--one", nargs="+", help=argparse.SUPPRESS)   # internal: one run in this process
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    if args.one:
        kind = args.one[0]
        result = run_steps(args.steps, args.one[1] == "on") if kind == "steps" else run_long(args.records)
        print(json.dumps(result))
        return 0

    import platform

    import torch
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}")
    results = []
    if args.only in (None, "steps"):
        for on in ("off", "on"):
            r = fresh(["--one", "steps", on, "--steps", str(args.steps)])
            results.append(r)
            first, last = r["marks"][0], r["marks"][-1]
            print(f"steps: {r['steps']} steps, debugger {on:3s} (dumps {', '.join(r['dumped']) or '-'}): "
                  f"RSS {first['rss_mb']:.1f} MB after step 1 -> {last['rss_mb']:.1f} MB after step "
                  f"{last['step']} ({r['rss_growth_mb']:+.1f} MB); live objects {first['objects']} -> "
                  f"{last['objects']} ({r['object_growth']:+d})")
            print("       RSS MB at steps " + ", ".join(f"{m['step']}: {m['rss_mb']:.1f}" for m in r["marks"]))
    if args.only in (None, "long"):
        r = fresh(["--one", "long", "--records", str(args.records)])
        results.append(r)
        print(f"long: {r['records']} records in one L1 step ({r['us_per_record']:.0f} us per call recorded), "
              f"{r['written']} written")
        print(f"      memory per record while collecting: {r['traced_bytes_per_record']:.0f} B Python heap "
              f"(tracemalloc), compact record {r['compact_bytes_per_record']:.0f} B, RSS "
              f"{r['rss_bytes_per_record']:.0f} B")
        print(f"      stop() {r['stop_s']:.2f} s vs the write itself {r['write_s']:.2f} s "
              f"({r['stop_over_write']:.2f}x); dump.json {r['dump_json_mb']:.1f} MB; RSS "
              f"{r['rss_before_write_mb']:.0f} MB before writing, peak {r['rss_peak_while_writing_mb']:.0f} MB "
              f"while writing")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
