"""A plain training script for the ctl tests: trains until stopped (or a step limit), writing
its completed step count to ``<root>/progress`` after each step."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import nbmonitor

root = Path(sys.argv[1])
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, run_dir=root / "runs", display=False, interval=0.05)
(root / "run_dir").write_text(str(mon.run_dir))
progress = root / "progress"
try:
    for _ in range(limit):
        x = torch.randn(16, 4)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
        progress.write_text(f"{mon.step} {opt.param_groups[0]['lr']}")
        time.sleep(0.01)
finally:
    (root / "finally").write_text("ran")  # a stop runs the loop's finally blocks
mon.close()
print("the loop ended by itself")
