"""Compare's culprit on the harder cases (issue 32): where a value that was already bad came in, constants that
are not causes, and the rules that hold them. Small seeded models, each case trained twice (target with the
fault, golden without) and compared.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe_lite.compare import compare
from msprobe_lite.compare.overflow import analyse
from msprobe_lite.pytorch import PrecisionDebugger


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def train(path, level, model=mlp, before=None, steps=2, task="statistics"):
    """AdamW steps of `model()`, dumped at `level`; `before(model, x)` plants a fault before step 0."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
    if before is not None:
        with torch.no_grad():
            before(m, x)
    dbg = PrecisionDebugger(dump_path=str(path), task=task, level=level)
    for _ in range(steps):
        dbg.start(model=m)
        F.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()


def pairs(tmp_path, level, fault, **kw):
    train(tmp_path / "target", level, before=fault, **kw)
    train(tmp_path / "golden", level, **kw)
    return compare(str(tmp_path / "target"), str(tmp_path / "golden"), str(tmp_path / "out"), quiet=True).to_json()["pairs"]


def nan_weight(m, x):
    m[2].weight[3, 5] = float("nan")


def nan_input(m, x):
    x[2, 3] = float("nan")


@pytest.mark.parametrize("level, call, weight", [
    ("L0", "Module.2.Linear.forward.0", "the weight of Module.2.Linear is NaN at the start of step 0"),
    ("L1", "Functional.linear.1.forward", "its input.1, which requires grad as a weight does, is NaN at the start "
                                          "of step 0"),
    ("mix", "Functional.linear.1.forward", "the weight of Module.2.Linear is NaN at the start of step 0"),
])
def test_a_weight_already_nan_is_named_at_its_first_use(tmp_path, level, call, weight):
    """The loss's backward is the first call to make NaN from finite inputs of its own, but the NaN came in
    with a weight: that weight and its first use are the answer, at every level, in compare and
    overflow_check alike; the next step names the weight that step 0's NaN update spoiled first."""
    step0, step1 = pairs(tmp_path, level, nan_weight)
    first = step0["first_divergence"]
    assert first["name"] == call and first["reason"].startswith(weight), first
    assert step1["first_divergence"]["reason"].split(" is NaN")[0] in (
        "the weight of Module.0.Linear", "its input.1, which requires grad as a weight does,")
    found = analyse(str(tmp_path / "target"), str(tmp_path / "overflow"), quiet=True)["ranks"][0]["first_overflow"]
    assert found["name"] == call and found["reason"].startswith(weight.replace(" (the golden's is finite)", ""))


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_input_data_already_nan_is_the_first_error_not_a_divergence(tmp_path, level):
    """NaN in the batch is no call's doing: no divergent call found; the first error is the first call that
    takes it, as docs/compare.md says, and no later call (the loss's backward) is named for it."""
    (step0,) = pairs(tmp_path, level, nan_input, steps=1)
    assert step0["first_divergence"] is None
    first = step0["first_error"]
    assert first["name"] in ("Module.0.Linear.forward.0", "Functional.linear.0.forward")
    assert first["reason"].startswith("its input.0 is NaN where the golden's is finite, and no earlier call made it")
