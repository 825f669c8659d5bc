"""How step0/proc2277 was made: the reference tool (pip install mindstudio-probe, torch 2.13.0 CPU), with
cfgL0.json = {"task": "statistics", "dump_path": "dumpL0", "level": "L0", "statistics": {"summary_mode":
"statistics"}}. tests/test_compare.py dumps the same model with msprobe_lite and compares the two."""
import torch, torch.nn as nn
from msprobe.pytorch import PrecisionDebugger
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(s):
        super().__init__(); s.fc1 = nn.Linear(4, 3); s.act = nn.ReLU(); s.fc2 = nn.Linear(3, 2)
    def forward(s, x): return s.fc2(s.act(s.fc1(x)) + torch.tanh(x[:, :3]))
net = Net(); opt = torch.optim.SGD(net.parameters(), lr=0.1)
dbg = PrecisionDebugger("cfgL0.json")
for i in range(2):
    dbg.start(model=net)
    x = torch.randn(5, 4)
    loss = net(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
    dbg.stop(); dbg.step()
