"""Demo: train a small transformer with msprobe_lite on, twice: fp32 (golden) and bf16 autocast (target),
then compare the two dumps and say where they part.

Run it with `./tools/demo.sh` (that also builds the environment). Output goes to ./demo_output/.
"""
from __future__ import annotations

import json
import os
import shutil
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from msprobe_lite.compare import compare  # noqa: E402
from msprobe_lite.pytorch import PrecisionDebugger, seed_all  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_output")


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def train(dump_path: str, precision: str, steps: int = 3) -> list:
    """Same seed, same data, same model; only the compute precision differs."""
    seed_all(1234)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    debugger = PrecisionDebugger(task="statistics", dump_path=dump_path, level="mix")
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, 64, (4, 16))
        debugger.start(model=model)
        with autocast:
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 64), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        losses.append(loss.item())
    return losses


def show(dump_path: str) -> dict:
    print(f"\nDump tree under {dump_path}:")
    for step in sorted(os.listdir(dump_path)):
        for rank in sorted(os.listdir(os.path.join(dump_path, step))):
            files = sorted(os.listdir(os.path.join(dump_path, step, rank)))
            print(f"  {step}/{rank}/  {', '.join(files)}")
    with open(os.path.join(dump_path, "step0", "rank", "dump.json")) as f:
        data = json.load(f)["data"]
    print(f"step0 holds {len(data)} records (modules and APIs, forward and backward); the first ones:")
    for name in list(data)[:5]:
        print(f"  {name}")
    return data


def main() -> None:
    shutil.rmtree(OUT, ignore_errors=True)
    dumps = {}
    for precision in ("fp32", "bf16"):
        path = os.path.join(OUT, precision)
        losses = train(path, precision)
        print(f"\n[{precision}] losses: " + ", ".join(f"{l:.4f}" for l in losses))
        dumps[precision] = show(path)
    name = "Module.blocks.0.mlp.0.Linear.forward.0"
    print(f"\nThe same call in both runs ({name}, output):")
    for precision, data in dumps.items():
        out = data[name]["output"][0]
        print(f"  {precision}: dtype {out['dtype']:<15} Max {out['Max']:+.5f}  Min {out['Min']:+.5f}  "
              f"Mean {out['Mean']:+.6f}  Norm {out['Norm']:.5f}")
    print("\nmsprobe-lite compare -tp demo_output/bf16 -gp demo_output/fp32 -o demo_output/compare")
    summary = compare(os.path.join(OUT, "bf16"), os.path.join(OUT, "fp32"), os.path.join(OUT, "compare"))
    print("Within bf16 tolerance, no call introduces a divergence: the drift is rounding, spread evenly."
          if all(p["first_divergence"] is None for p in summary.pairs) else
          "A call introduces a divergence beyond bf16 rounding: see the first divergence above.")
    print(f"Tables and report: {os.path.join(OUT, 'compare')} (report.html, summary.json, one CSV per step)")


if __name__ == "__main__":
    main()
