"""With the debugger on, the model's outputs, loss and gradients are bitwise those of a run without it."""
from __future__ import annotations

import pytest
import torch

from models import train

from msprobe_lite.pytorch import PrecisionDebugger


def assert_bitwise(a, b):
    losses_a, params_a, grads_a = a
    losses_b, params_b, grads_b = b
    for x, y in zip(losses_a, losses_b):
        assert torch.equal(x, y)
    for name in params_a:
        assert torch.equal(params_a[name], params_b[name]), name
    for ga, gb in zip(grads_a, grads_b):
        for name in ga:
            assert torch.equal(ga[name], gb[name]), name


@pytest.mark.parametrize("kind", ["mlp_inplace", "cnn", "transformer"])
def test_training_is_bitwise_identical_with_l0_dump(tmp_path, kind):
    baseline = train(kind, steps=3)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    assert_bitwise(baseline, train(kind, steps=3, debugger=debugger))
    assert (tmp_path / "step2" / "rank" / "dump.json").exists()
