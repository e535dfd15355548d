"""attach(..., start_step=N) continues a resumed run's numbering: the first step is N + 1, live
and in the run on disk."""

from __future__ import annotations

from pathlib import Path

import torch
from tests.helpers import mlp, train

import nbmonitor


def test_a_resumed_run_goes_on_from_start_step(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, start_step=1000)
    assert mon.step == 1000
    train(model, opt, mon, steps=3, accumulate=2)
    mon.flush()
    assert mon.history()["step"].tolist() == [1001, 1002, 1003]
    assert mon.step == 1003
    mon.close()
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == [1001, 1002, 1003]
