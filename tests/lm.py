"""A small pre-norm transformer language model, device-agnostic (no tensor made inside forward): the compiled-model
tests and tools/check_cuda.py train it."""
from __future__ import annotations

import math

import torch
import torch.nn as nn


class Block(nn.Module):
    """Pre-norm attention and an MLP, each with a residual."""

    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        scores = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        x = x + self.proj(scores @ v)
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batch():
    """Seeded tokens and targets for Net: 2 sequences of 6."""
    gen = torch.Generator().manual_seed(7)
    return torch.randint(0, 32, (2, 6), generator=gen), torch.randint(0, 32, (2, 6), generator=gen)
