"""The checks that need a GPU, as one short run: training on CUDA with the debugger is bitwise that without it
(eager and torch.compile, L0/L1/mix, synchronous and async_dump), the dumped statistics of CUDA tensors are
those computed apart in float64, and acc_check judges the GPU's kernels without false alarms.

    python tools/check_cuda.py            # exits 0 when every check holds, 1 when one fails, 2 without CUDA

CI has no GPU: this is run by hand on a machine that has one (docs/performance.md says when it last ran).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from lm import Net  # noqa: E402  (the tests' small transformer, device-agnostic)

from msprobe_lite.pytorch import PrecisionDebugger  # noqa: E402

DEV = os.environ.get("CHECK_DEVICE", "cuda")  # CHECK_DEVICE=cpu runs the same checks on the CPU (to try the script)


def train(steps, debugger=None, compiled=False, dtype=torch.float32):
    torch.manual_seed(0)
    model = Net(vocab=128, d=64).to(DEV, dtype)
    run = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 128, (4, 32), device=DEV)
    losses = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model=run)
        logits = run(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.detach().clone())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a[0], b[0])) and all(torch.equal(a[1][n], b[1][n]) for n in a[1])


def check_bitwise(results, tmp):
    for compiled in (False, True):
        base = train(3, compiled=compiled)
        for level in ("L0", "L1", "mix"):
            for async_dump in (False, True) if not compiled else (False,):
                name = f"bitwise {'compiled' if compiled else 'eager'} {level}{' async_dump' if async_dump else ''}"
                path = os.path.join(tmp, name.replace(" ", "_"))
                cfg = os.path.join(tmp, name.replace(" ", "_") + ".json")
                with open(cfg, "w") as f:
                    json.dump({"task": "statistics", "dump_path": path, "level": level, "async_dump": async_dump}, f)
                results[name] = same(base, train(3, PrecisionDebugger(cfg), compiled=compiled))


def stats64(t):
    """Max, Min, Mean, Norm in float64, and the tensor's RMS: the scale a Mean near 0 is measured against."""
    t = t.detach().double().cpu()
    return [t.max().item(), t.min().item(), t.mean().item(), t.norm().item()], t.norm().item() / t.numel() ** 0.5


def check_statistics(results, tmp):
    """Each Linear's forward output, captured by a hook of this script, against the dump's record of that call."""
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-6)):
        for async_dump in (False, True):
            name = f"statistics {str(dtype)[6:]}{' async_dump' if async_dump else ''}"
            path = os.path.join(tmp, name.replace(" ", "_"))
            seen = {}
            torch.manual_seed(0)
            model = Net(vocab=128, d=64).to(DEV, dtype)
            def keep(name):
                def hook(module, args, output):
                    seen.setdefault(name, stats64(output))  # returns None: the output stays the model's
                return hook
            for mod_name, mod in model.named_modules():
                if isinstance(mod, nn.Linear):
                    mod.register_forward_hook(keep(mod_name))
            cfg = path + ".json"
            with open(cfg, "w") as f:
                json.dump({"task": "statistics", "dump_path": path, "level": "L0", "async_dump": async_dump}, f)
            debugger = PrecisionDebugger(cfg)
            debugger.start(model=model)
            model(torch.randint(0, 128, (4, 31), device=DEV)).float().sum().backward()
            debugger.stop()
            debugger.step()
            with open(os.path.join(path, "step0", "rank", "dump.json")) as f:
                data = json.load(f)["data"]
            worst = 0.0
            for mod_name, (want, rms) in seen.items():
                key = next(k for k in data if k.startswith(f"Module.{mod_name}.Linear.forward."))
                got = [data[key]["output"][0][s] for s in ("Max", "Min", "Mean", "Norm")]
                worst = max(worst, max(abs(g - w) / max(abs(w), rms) for g, w in zip(got, want)))
            results[name] = worst <= tol and len(seen) == sum(isinstance(m, nn.Linear) for m in model.modules())
            print(f"  {name}: {len(seen)} Linear outputs, worst relative difference {worst:.3g}")


def check_acc_check(results, tmp):
    """acc_check on dumps made on the GPU (its kernels, cuBLAS, replayed in float64 on the CPU): no call of the
    clean transformer fails in float32 or bfloat16, and a tanh off by a relative 2e-4 is the first failure."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from msprobe_lite.acc_check import acc_check

    class Off(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            return out * (1 + 2e-4) if func is torch.ops.aten.tanh.default else out

    for dtype, fault in ((torch.float32, False), (torch.bfloat16, False), (torch.float32, True)):
        name = f"acc_check {str(dtype)[6:]}{' tanh fault' if fault else ''}"
        path = os.path.join(tmp, name.replace(" ", "_"))
        torch.manual_seed(0)
        model = Net(vocab=128, d=64).to(DEV, dtype)
        debugger = PrecisionDebugger(dump_path=path, task="tensor", level="L1")
        debugger.start(model=model)
        tokens = torch.randint(0, 128, (4, 31), device=DEV)
        if fault:
            with Off():
                torch.tanh(model(tokens)).float().pow(2).mean().backward()
        else:
            model(tokens).float().pow(2).mean().backward()
        debugger.stop()
        debugger.step()
        s = acc_check(path, path + "_out", quiet=True)
        first = (s["first_failure"] or {}).get("name")
        results[name] = (first or "").startswith("Torch.tanh.") if fault else first is None
        print(f"  {name}: {s['counts']}, first failure {first}")


def main() -> int:
    if DEV == "cuda" and not torch.cuda.is_available():
        print("check_cuda: no CUDA device", file=sys.stderr)
        return 2
    # Two runs compare bitwise only when each is reproducible: atomics (an embedding's backward, on CUDA and in
    # inductor's CPU code) add in an order that varies from run to run
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if DEV == 'cuda' else DEV}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for check in (check_statistics, check_bitwise, check_acc_check):
            try:
                check(results, tmp)
            except Exception:  # noqa: BLE001 - report every check, then fail
                traceback.print_exc()
                results[check.__name__] = False
    for name, ok in results.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if results and all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
