"""MindSpore demo: the same MLP, CNN and attention block written in PyTorch and in MindSpore, the PyTorch weights converted
into a MindSpore checkpoint, both runs dumped (forward, backward, parameter gradients) and compared.
Every record pairs across the frameworks and passes.

Run it after `./tools/demo.sh` or `./tools/test.sh` built the environment:
`.venv/bin/python tools/demo_mindspore.py`. Output goes to ./demo_output/mindspore/.
"""
from __future__ import annotations

import math
import os
import shutil
import sys

import mindspore as ms
import numpy as np
import torch
from mindspore import mint, nn, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from msprobe_lite.compare import compare  # noqa: E402
from msprobe_lite.compare.weights import compare_weights  # noqa: E402
from msprobe_lite.mindspore import PrecisionDebugger as MsDebugger  # noqa: E402
from msprobe_lite.mindspore.checkpoint import convert_checkpoint  # noqa: E402
from msprobe_lite.pytorch import PrecisionDebugger as TorchDebugger  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_output", "mindspore")


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.norm = torch.nn.LayerNorm(16, eps=1e-5)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


class MsMLP(nn.Cell):
    def __init__(self, norm_eps=1e-5, act=None):  # a planted difference: another epsilon, activation
        super().__init__()
        self.fc1, self.fc2 = mint.nn.Linear(8, 16), mint.nn.Linear(16, 4)
        self.norm = nn.LayerNorm((16,), epsilon=norm_eps)
        self.act = act if act is not None else nn.ReLU()

    def construct(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


class TorchCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)  # BatchNorm follows: a bias would be
        # redundant, and its gradient is zero up to rounding noise, which no tolerance can judge
        self.bn = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU()
        self.head = torch.nn.Linear(64, 3)

    def forward(self, x):
        h = self.relu(self.bn(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1))


class MsCNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.head = nn.Dense(64, 3)

    def construct(self, x):
        h = self.relu(self.bn(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1))


class TorchAttention(torch.nn.Module):
    """Scaled dot-product attention as PyTorch code writes it: `q @ k.transpose(...)` (Tensor.matmul),
    `torch.softmax` (Torch.softmax), `x.chunk` (Tensor.chunk)."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
        return self.out(att @ v)


class MsAttention(nn.Cell):
    """The same in MindSpore's spelling (ops.matmul, ops.softmax, ops.chunk); `scaled=False` plants a
    porting bug: the scale left out."""

    def __init__(self, scaled=True):
        super().__init__()
        self.qkv, self.out = mint.nn.Linear(8, 24), mint.nn.Linear(8, 8)
        self.scaled = scaled

    def construct(self, x):
        q, k, v = ops.chunk(self.qkv(x), 3, -1)
        scores = ops.matmul(q, k.swapaxes(-2, -1))
        if self.scaled:
            scores = scores / math.sqrt(8)
        return self.out(ops.matmul(ops.softmax(scores, axis=-1), v))


NETWORKS = {"mlp": (TorchMLP, MsMLP, (4, 8)), "cnn": (TorchCNN, MsCNN, (2, 3, 4, 4)),
            "attention": (TorchAttention, MsAttention, (2, 5, 8))}


def converted_pair(kind: str, folder: str, **ms_kwargs):
    """(PyTorch net, MindSpore net with the PyTorch weights, input): through files, as a user would."""
    torch_cls, ms_cls, shape = NETWORKS[kind]
    torch.manual_seed(0)
    tnet, mnet = torch_cls(), ms_cls(**ms_kwargs)
    os.makedirs(folder, exist_ok=True)
    pt, template, ckpt = (os.path.join(folder, f"{kind}.{ext}") for ext in ("pt", "template.ckpt", "ckpt"))
    torch.save(tnet.state_dict(), pt)
    ms.save_checkpoint(mnet, template)
    report = convert_checkpoint(pt, ckpt, template)
    if not report.complete:
        raise SystemExit("\n".join(report.lines()))
    ms.load_param_into_net(mnet, ms.load_checkpoint(ckpt))
    mnet.set_train(True)  # PyTorch modules start in training mode, MindSpore cells do not (BatchNorm!)
    return tnet, mnet, np.random.RandomState(3).randn(*shape).astype(np.float32), (pt, ckpt)


def dump_both(kind: str, folder: str, level: str = "L0", **ms_kwargs) -> tuple:
    """One training step of each framework, dumped; returns (MindSpore step folder, PyTorch step folder)."""
    tnet, mnet, x, _ = converted_pair(kind, folder, **ms_kwargs)
    debugger = TorchDebugger(dump_path=os.path.join(folder, "pytorch"), task="statistics", level=level)
    debugger.start(tnet)
    (tnet(torch.from_numpy(x)) ** 2).mean().backward()
    debugger.stop()
    debugger.step()
    debugger = MsDebugger(dump_path=os.path.join(folder, "mindspore"), task="statistics", level=level)
    debugger.start(mnet)
    ms.value_and_grad(lambda inp: (mnet(inp) ** 2).mean(), None, mnet.trainable_params())(ms.Tensor(x))
    debugger.stop()
    debugger.step()
    return os.path.join(folder, "mindspore", "step0"), os.path.join(folder, "pytorch", "step0")


def main() -> int:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    shutil.rmtree(OUT, ignore_errors=True)
    failures = 0
    for kind in NETWORKS:
        folder = os.path.join(OUT, kind)
        _, _, _, (pt, ckpt) = converted_pair(kind, folder)
        rows = compare_weights(pt, ckpt)
        print(f"[{kind}] weights: {sum(r.result == 'equal' for r in rows)}/{len(rows)} parameters equal "
              f"after conversion ({os.path.basename(pt)} -> {os.path.basename(ckpt)})")
        ms_step, pt_step = dump_both(kind, folder)
        summary = compare(ms_step, pt_step, os.path.join(folder, "compare"), quiet=True)
        counts = summary.pairs[0]["counts"]
        print(f"[{kind}] MindSpore vs PyTorch: {counts}")
        failures += counts["error"] + counts["warning"] + counts["unmatched_target"] + counts["unmatched_golden"]
    print(f"dumps and reports in {OUT}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
