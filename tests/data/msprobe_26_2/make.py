"""How these dumps were made, with the reference tool (mindstudio-probe 26.2.0, PyTorch 2.13 CPU, in a scratch
virtual environment with its dependencies): a seeded MLP, one SGD step, dumped by msprobe's own debugger.

    python make.py OUT LEVEL [loss]     # loss: the loss scaled by 1.001 (a fault only the backward sees)

loss_scaled_L0_target = `make.py OUT L0 loss`, loss_scaled_L0_golden = `make.py OUT L0`, mlp_mix = `make.py OUT
mix`. tests/test_compare_culprits.py trains the same MLP with msprobe_lite to compare against mlp_mix.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from msprobe.pytorch import PrecisionDebugger

out, level = sys.argv[1], sys.argv[2]
scale = 1.001 if sys.argv[3:] == ["loss"] else 1.0
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.SGD(m.parameters(), lr=1e-2)
os.makedirs(out, exist_ok=True)
json.dump({"task": "statistics", "dump_path": out, "level": level, "rank": [], "step": [0],
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}},
          open(out + "/config.json", "w"))
dbg = PrecisionDebugger(config_path=out + "/config.json")
gen = torch.Generator().manual_seed(1)
x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
dbg.start(model=m)
(F.cross_entropy(m(x), y) * scale).backward()
opt.step()
dbg.stop()
dbg.step()
