"""Real PyTorch models made in code, seeded, for the tests (no downloads)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU(inplace=inplace)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class CNN(nn.Module):
    """Conv + BatchNorm + in-place ReLU, a `relu_()` on a module output, pooling and a head."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.bn2(self.conv2(x)).relu_()
        return self.head(self.pool(x).flatten(1))


class Scale(nn.Module):
    """A module called with a keyword argument."""

    def forward(self, x, *, factor=1.0):
        return x * factor


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)
        self.scale = None            # fault injection: a different attention scale
        self.half_scores = False     # fault injection: scores computed in float16 (overflows to inf)
        self.boost = 1.0

    def forward(self, x, mask=None):
        b, s, d = x.shape
        h = self.heads

        def split(t):
            return t.view(b, s, h, d // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        q = q * self.boost
        if self.half_scores:
            q, k = q.half(), k.half()
        scores = torch.matmul(q, k.transpose(-2, -1))
        scores = (scores.float() if self.half_scores else scores) * (self.scale or (d // h) ** -0.5)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = self.drop(F.softmax(scores, dim=-1))
        return self.out((weights @ v).transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """Embedding, blocks with attention/layer norm/dropout, a shared projection used twice, a kwargs module,
    and a head whose output is a (logits, aux dict) tuple."""

    def __init__(self, vocab=32, d=16, heads=2, layers=2, seq=6):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.shared = nn.Linear(d, d)          # called twice per forward
        self.scale = Scale()
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.extra_call = False      # fault injection: one more API call, shifting later call numbers

    def forward(self, tokens):
        s = tokens.shape[1]
        if self.extra_call:
            torch.matmul(self.pos, self.pos.t())
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        x = self.embed(tokens) + self.pos[:s]
        for block in self.blocks:
            x = block(x, mask=mask)
        x = self.shared(torch.tanh(self.shared(x)))
        x = self.scale(x, factor=0.5)
        logits = self.head(self.norm(x))
        return logits, {"mean": logits.mean()}


def make(kind: str, seed: int = 0):
    """A seeded model and a matching input batch (and target)."""
    torch.manual_seed(seed)
    if kind == "mlp":
        return MLP(), torch.randn(4, 8), torch.randint(0, 4, (4,))
    if kind == "mlp_inplace":
        return MLP(inplace=True), torch.randn(4, 8), torch.randint(0, 4, (4,))
    if kind == "cnn":
        return CNN(), torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))
    if kind == "transformer":
        return TinyTransformer(), torch.randint(0, 32, (2, 6)), torch.randint(0, 32, (2, 6))
    raise ValueError(kind)


def loss_of(kind, model, x, y):
    out = model(x)
    if kind == "transformer":
        logits, aux = out
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) + 0.0 * aux["mean"]
    return F.cross_entropy(out, y)


def train(kind, steps=2, debugger=None, seed=0, lr=0.1):
    """Train `steps` SGD steps; returns (losses, final parameters, per-step gradients), all detached clones."""
    model, x, y = make(kind, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, grads = [], []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model=model)
        torch.manual_seed(seed + 100 + len(losses))  # dropout masks: same with and without the debugger
        loss = loss_of(kind, model, x, y)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(loss.detach().clone())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}, grads
