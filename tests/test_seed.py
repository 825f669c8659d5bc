"""seed_all: seeded runs dump identical numbers; rm_dropout removes dropout; invalid arguments raise."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from models import TinyTransformer

from msprobe_lite.pytorch import PrecisionDebugger, seed_all


@pytest.fixture(autouse=True)
def restore_torch():
    """seed_all changes process-wide state; put it back for the other tests."""
    saved = {n: getattr(F, n) for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                        "feature_alpha_dropout", "scaled_dot_product_attention")}
    dropout, deterministic = torch.dropout, torch.are_deterministic_algorithms_enabled()
    yield
    for name, fn in saved.items():
        setattr(F, name, fn)
    torch.dropout = dropout
    torch.use_deterministic_algorithms(deterministic)


def seeded_dump(tmp_path, name):
    seed_all(1234)
    model = TinyTransformer()           # has nn.Dropout in attention, active in train mode
    tokens = torch.randint(0, 32, (2, 6))
    d = PrecisionDebugger(dump_path=str(tmp_path / name), task="statistics", level="mix")
    for _ in range(2):
        d.start(model=model)
        logits, _ = model(tokens)
        logits.sum().backward()
        d.stop()
        d.step()
    return [(tmp_path / name / f"step{s}" / "rank" / "dump.json").read_bytes() for s in (0, 1)]


def test_two_seeded_runs_give_bitwise_identical_dumps(tmp_path):
    first, second = seeded_dump(tmp_path, "a"), seeded_dump(tmp_path, "b")
    assert first == second
    assert b"Functional.dropout" in first[0]


def test_dropout_removal_undone_after_the_debugger_wrapped_it(tmp_path):
    """NetDifferenceFinder removes dropout for its run only, while its debugger wraps the same functions: put
    back, dropout drops again and later dumps still record it (the wrapper, buried, passes calls through)."""
    from msprobe_lite.pytorch.seed import remove_dropout

    x = torch.ones(64, 64)
    undo = remove_dropout()
    d = PrecisionDebugger(dump_path=str(tmp_path / "during"), task="statistics", level="L1")
    d.start()
    assert torch.equal(F.dropout(x, 0.5, True), x) and torch.equal(nn.Dropout(0.5).train()(x), x)
    d.stop()
    d.step()
    undo()
    assert (F.dropout(x, 0.5, True) == 0).any() and (nn.Dropout(0.5).train()(x) == 0).any()
    assert (torch.dropout(x, 0.5, True) == 0).any()
    later = PrecisionDebugger(dump_path=str(tmp_path / "after"), task="statistics", level="L1")
    later.start()
    dropped = F.dropout(x, 0.5, True)
    later.stop()
    later.step()
    assert (dropped == 0).any()
    assert b"Functional.dropout.0.forward" in (tmp_path / "after" / "step0" / "rank" / "dump.json").read_bytes()
    remove_dropout()  # removed again: the pass-through wrapper or a new one
    assert torch.equal(F.dropout(x, 0.5, True), x)


def test_dropout_removed_after_a_debugger_was_made_is_still_recorded(tmp_path):
    """seed_all(rm_dropout=True) after PrecisionDebugger(...): the capture, made with the API list before the
    removal, still records the dropout calls (as the function it replaced) and the removal holds."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    seed_all(1234, rm_dropout=True)
    x = torch.ones(64, 64)
    debugger.start()
    kept = F.dropout(x, 0.5, True)
    debugger.stop()
    debugger.step()
    assert torch.equal(kept, x)
    assert b"Functional.dropout.0.forward" in (tmp_path / "step0" / "rank" / "dump.json").read_bytes()


def test_seed_all_seeds_every_generator():
    seed_all(7)
    a = (random.random(), np.random.rand(), torch.rand(1).item(), os.environ["PYTHONHASHSEED"])
    seed_all(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item(), os.environ["PYTHONHASHSEED"]) == a
    assert a[3] == "7"


def test_rm_dropout_makes_training_mode_deterministic_even_for_existing_modules():
    drop = nn.Dropout(0.5)              # created before seed_all
    drop.train()
    x = torch.ones(1000)
    assert not torch.equal(drop(x), x)
    seed_all(1, rm_dropout=True)
    assert torch.equal(drop(x), x)
    assert torch.equal(F.dropout(x, 0.9, training=True), x)
    assert torch.equal(nn.functional.dropout2d(torch.ones(2, 3, 4, 4), 0.5, True), torch.ones(2, 3, 4, 4))
    q = torch.randn(1, 2, 4, 8)
    a = F.scaled_dot_product_attention(q, q, q, dropout_p=0.9)
    assert torch.equal(a, F.scaled_dot_product_attention(q, q, q, dropout_p=0.9))
    m = TinyTransformer()
    m.train()
    tokens = torch.randint(0, 32, (2, 6))
    assert torch.equal(m(tokens)[0], m(tokens)[0])


def test_mode_true_turns_on_deterministic_algorithms_and_false_leaves_them():
    torch.use_deterministic_algorithms(False)
    seed_all(1, mode=False)
    assert not torch.are_deterministic_algorithms_enabled()
    seed_all(1, mode=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"seed": 2 ** 32}, {"seed": 1.5}, {"seed": True},
                                    {"mode": 1}, {"rm_dropout": "yes"}])
def test_invalid_arguments_raise(kwargs):
    with pytest.raises(ValueError, match="seed_all"):
        seed_all(**kwargs)


def test_pytorch_default_keeps_dropout_as_msprobe_documents():
    """msprobe documents `seed_all(seed=1234, mode=False, rm_dropout=False)` for PyTorch: dropout stays."""
    drop = nn.Dropout(0.5)
    drop.train()
    seed_all()
    x = torch.ones(1000)
    assert not torch.equal(drop(x), x)


MINDSPORE_DEFAULT = """
import numpy as np, mindspore as ms
from mindspore import nn
from msprobe_lite.mindspore import seed_all

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Dense(16, 16), nn.Dropout(p=0.5)
    def construct(self, x):
        return self.drop(self.fc(x))

ms.set_seed(0)
net, x = Net(), ms.Tensor(np.random.RandomState(0).rand(8, 16).astype(np.float32))
net.set_train(False)
evaluated = net(x).asnumpy()
net.set_train(True)
assert not np.array_equal(net(x).asnumpy(), evaluated), "dropout was not active before seed_all"
seed_all()
first, second = net(x).asnumpy(), net(x).asnumpy()
assert np.array_equal(first, second) and np.array_equal(first, evaluated), "dropout still active"
print("ok")
"""


def test_mindspore_default_removes_dropout_as_its_seed_document_says():
    """The MindSpore seed_all is documented as `seed_all(seed=1234, mode=False, rm_dropout=True)`: with the
    defaults a network with Dropout in training mode gives the same output twice, equal to evaluation mode.
    A child process: removing dropout is for the whole process, and other tests need MindSpore's dropout."""
    done = subprocess.run([sys.executable, "-c", MINDSPORE_DEFAULT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
