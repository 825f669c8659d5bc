"""Small MindSpore networks for the adapter's tests, made in code and seeded: an MLP, a CNN with BatchNorm and
an in-place op, and an attention block whose q/k/v share their input; plus a PyNative training loop."""
from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import mint, nn, ops

ms.set_context(mode=ms.PYNATIVE_MODE)


class MLP(nn.Cell):
    def __init__(self, scale=1.0):
        super().__init__()
        self.fc1 = mint.nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = mint.nn.Linear(16, 4)
        self.scale = scale

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)) * self.scale)


class CNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.head = nn.Dense(4 * 4 * 4, 3)

    def construct(self, x):
        h = self.relu(self.bn(self.conv(x)))
        h[:, 0] = 0.5                     # in place, on a cell's output (MindSpore 2.10's add_ is not)
        return self.head(h.reshape(h.shape[0], -1))


class Attention(nn.Cell):
    def __init__(self, d=8):
        super().__init__()
        self.q = mint.nn.Linear(d, d)
        self.k = mint.nn.Linear(d, d)
        self.v = mint.nn.Linear(d, d)
        self.out = mint.nn.Linear(d, d)
        self.norm = nn.LayerNorm((d,))
        self.scale = d ** -0.5

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = mint.matmul(q, k.swapaxes(-1, -2)) * self.scale
        attn = ops.softmax(scores, axis=-1)
        return self.norm(x + self.out(mint.matmul(attn, v)))


def make(kind, **kwargs):
    ms.set_seed(0)
    np.random.seed(0)
    net = {"mlp": MLP, "cnn": CNN, "attention": Attention}[kind](**kwargs)
    shape = {"mlp": (4, 8), "cnn": (2, 3, 4, 4), "attention": (2, 5, 8)}[kind]
    x = ms.Tensor(np.random.RandomState(1).randn(*shape).astype(np.float32))
    return net, x


def train(kind, steps=2, debugger=None, level_needs_model=True, **kwargs):
    """A few SGD steps; returns (losses, final parameters, gradients per step) as numpy arrays."""
    net, x = make(kind, **kwargs)
    net.set_train(True)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)

    def loss_fn(inp):
        return (net(inp) ** 2).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    losses, grads = [], []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net)
        loss, g = grad_fn(x)
        opt(g)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.asnumpy())
        grads.append([t.asnumpy() for t in g])
    params = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    return losses, params, grads
