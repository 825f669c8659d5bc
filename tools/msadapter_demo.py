"""One PyTorch-style training script, two backends: real PyTorch, or MindSpore through MSAdapter.

This is the migration recipe: run the same script, same weights, same input, on both, dump both, compare.
Records pair by name (MSAdapter dumps use PyTorch's names) and agree within fp32 tolerance.

    .venv/bin/python   tools/msadapter_demo.py --backend torch     --dump out/torch
    .venv39/bin/python tools/msadapter_demo.py --backend msadapter --dump out/msadapter
    msprobe-lite compare -tp out/msadapter/step0 -gp out/torch/step0 -o out/compare

(`.venv39`: Python 3.9 + MindSpore 2.0.0 + MSAdapter 0.1.0, built by tools/test_msadapter.sh.) The only
backend-specific lines are the imports, setting a weight, and how gradients are taken: MSAdapter 0.1 has
no `loss.backward()`; gradients come from `mindspore.value_and_grad`.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _backend() -> str:
    """Chosen before the imports below: --backend (either spelling), or MSPROBE_LITE_DEMO_BACKEND (tests)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--backend", choices=("torch", "msadapter"))
    known, _ = early.parse_known_args()
    return known.backend or os.environ.get("MSPROBE_LITE_DEMO_BACKEND", "torch")


BACKEND = _backend() if __name__ == "__main__" else os.environ.get("MSPROBE_LITE_DEMO_BACKEND", "torch")
if BACKEND == "msadapter":
    import mindspore as ms
    import msadapter.pytorch as torch
    import msadapter.pytorch.nn as nn
    import msadapter.pytorch.nn.functional as F

    from msprobe_lite.mindspore import PrecisionDebugger
else:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from msprobe_lite.pytorch import PrecisionDebugger


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(h.view(h.size(0), -1))


MODELS = {"mlp": (MLP, (4, 8)), "cnn": (CNN, (2, 3, 4, 4))}


def weights_for(model) -> dict:
    """The same weights on every backend: drawn from a seeded numpy generator in parameter order."""
    rng = np.random.RandomState(0)
    return {name: (rng.randn(*tuple(p.shape)) * 0.3).astype(np.float32) for name, p in model.named_parameters()}


def set_weights(model, values: dict) -> None:
    for name, p in model.named_parameters():
        if BACKEND == "msadapter":
            p.set_data(ms.Tensor(values[name]))
        else:
            with torch.no_grad():
                p.copy_(torch.from_numpy(values[name]))


def loss_of(model, x):
    out = model(x)
    return (out * out).mean()


def train_step(model, x):
    """Loss and gradients (w.r.t. the input, then the parameters), as the backend's tensors."""
    if BACKEND == "msadapter":
        loss, (gx, grads) = ms.value_and_grad(lambda inp: loss_of(model, inp), 0,
                                              model.trainable_params())(x)
        return loss, [gx] + list(grads)
    loss = loss_of(model, x)
    loss.backward()
    return loss, [x.grad] + [p.grad for p in model.parameters()]


def as_numpy(t) -> np.ndarray:
    return t.asnumpy() if BACKEND == "msadapter" else t.detach().numpy()


def build(kind):
    cls, shape = MODELS[kind]
    model = cls()
    set_weights(model, weights_for(model))
    x = torch.tensor(np.random.RandomState(1).randn(*shape).astype(np.float32))
    if BACKEND == "torch":
        x.requires_grad_(True)   # MSAdapter's gradient w.r.t. the input comes from grad_position=0
    return model, x


def run(kind: str, dump: str | None, level: str = "L0", task: str = "statistics"):
    """One training step of `kind`, dumped to `dump` when given; returns (loss, gradients)."""
    model, x = build(kind)
    debugger = PrecisionDebugger(dump_path=dump, task=task, level=level) if dump else None
    if debugger:
        debugger.start(model)
    loss, grads = train_step(model, x)
    if debugger:
        debugger.stop()
        debugger.step()
    return as_numpy(loss), [as_numpy(g) for g in grads]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("torch", "msadapter"), default="torch")
    parser.add_argument("--dump", required=True, help="dump_path")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--level", default="L0")
    parser.add_argument("--task", default="statistics")
    args = parser.parse_args()
    loss, _ = run(args.model, args.dump, args.level, args.task)
    print(f"{BACKEND} {args.model} {args.level}: loss {float(loss):.8f}, dump in {args.dump}")


if __name__ == "__main__":
    main()
