"""Reading dumps and computing expected statistics independently (numpy, float64), for assertions."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from msprobe_lite.core import native

# The lane: False when MSPROBE_LITE_PURE_PYTHON=1 keeps every C route out (core/native.py), the one condition
# that every C-only test and C-side of a comparison below is skipped by.
C_ROUTES = not native.PURE_PYTHON
# A test, or a parametrised case, that asserts a C route is built or used
c_route = pytest.mark.skipif(not C_ROUTES, reason="asserts a C route: runs in the C lane")
# `route` parameters of a test that runs on both routes: its "C" case only in the C lane
ROUTE_PARAMS = [pytest.param("C", marks=c_route), "Python"]
# The routes a test that compares them in one run goes through: its C side only in the C lane
ROUTES_HERE = ("C", "Python") if C_ROUTES else ("Python",)


def dump_files(dump_path) -> dict:
    """{relative path: bytes} of every file under `dump_path`: two dumps compared byte for byte."""
    files = {}
    for root, _, names in os.walk(str(dump_path)):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                files[os.path.relpath(os.path.join(root, name), str(dump_path))] = f.read()
    return files


def assert_same_files(a: dict, b: dict, at_least: int = 1) -> None:
    assert sorted(a) == sorted(b) and len(a) >= at_least, (sorted(a), sorted(b))
    for name in a:
        assert a[name] == b[name], name


def load(dump_path, step=0, rank=None, name="dump.json"):
    folder = os.path.join(str(dump_path), f"step{step}", "rank" if rank is None else f"rank{rank}")
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


def data(dump_path, step=0, rank=None):
    return load(dump_path, step, rank)["data"]


def expected_stats(tensor):
    """(Max, Min, Mean, Norm) computed in float64 from the tensor's values, independently of the tool."""
    a = tensor.detach().cpu().double().numpy() if hasattr(tensor, "detach") else np.asarray(tensor, np.float64)
    return float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a * a).sum()))


def assert_stats(entry, tensor, rel=1e-5):
    """A dumped tensor object matches `tensor`: dtype, shape and the four statistics."""
    assert entry["shape"] == list(tensor.shape), (entry, tensor.shape)
    assert entry["dtype"] == str(tensor.dtype)
    for key, want in zip(("Max", "Min", "Mean", "Norm"), expected_stats(tensor)):
        got = entry[key]
        assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-6), (key, got, want)


def leave_spawned_worker() -> None:
    """End a torch.multiprocessing worker whose files are on disk, without Python's teardown. PyTorch's gloo
    teardown fails now and then on this machine, with or without a debugger step in the worker: a deadlock
    (the main thread joins gloo's worker holding the GIL, which the worker needs to free a Python object of a
    finished work), or an abort ("terminate called without an active exception"). Neither is under test."""
    os._exit(0)


def deterministic_compiled_runs():
    """Body of the compiled tests' autouse fixture. Inductor's CPU backward of an embedding adds with atomics,
    whose order varies from run to run: deterministic algorithms make a compiled run reproducible, so that
    "bitwise as without the debugger" is a claim about the debugger. Dynamo's compiler is unwrapped first
    (compiled_capture.py: a debugger of an earlier test that never finished leaves it wrapped), so that the
    runs without a debugger compile graphs without statistics."""
    import torch

    from msprobe_lite.pytorch import compiled_capture
    compiled_capture.ACTIVE.clear()
    compiled_capture.uninstall()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def classifier_steps(path, level, model, optimizer, steps=2, before=None, optimizer_in_window=True,
                     task="statistics"):
    """Seeded cross-entropy training steps of `model` (8 features in, 4 classes out; a PyTorch module) with
    `optimizer(params)`, dumped at `level` into `path`; `before(model, x)` plants a fault before step 0 (under
    no_grad). The optimizer's update is inside the dumped window unless `optimizer_in_window` is False."""
    import torch
    import torch.nn.functional as F

    from msprobe_lite.pytorch import PrecisionDebugger

    opt = optimizer(model.parameters())
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
    if before is not None:
        with torch.no_grad():
            before(model, x)
    dbg = PrecisionDebugger(dump_path=str(path), task=task, level=level)
    dumped_steps(dbg, model, lambda: F.cross_entropy(model(x), y), opt, steps, optimizer_in_window)


def dumped_steps(dbg, model, loss, opt, steps, optimizer_in_window=True) -> None:
    """`steps` training steps (`loss()`, its backward, `opt`'s update) each dumped by debugger `dbg` on `model`,
    the update inside the dumped window or after it."""
    for _ in range(steps):
        dbg.start(model=model)
        loss().backward()
        if not optimizer_in_window:
            dbg.stop()
        opt.step()
        opt.zero_grad()
        if optimizer_in_window:
            dbg.stop()
        dbg.step()
