"""optimizer.step(closure) runs forward and backward inside, after the optimizer's pre-step
hooks: grad_norm is the norm of the gradients the closure left (this step's), given by keyword
or by position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import mlp

import nbmonitor


@pytest.mark.parametrize("by_keyword", [True, False])
def test_grad_norm_is_the_closures_gradients(tmp_path: Path, by_keyword: bool) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    totals: list[float] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        totals.append(float(torch.nn.utils.get_total_norm(grads)))
        return loss

    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(4):
            if by_keyword:
                opt.step(closure=closure)
            else:
                opt.step(closure)
        assert mon.flush()
        h = mon.history()
    assert h["step"].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(h["grad_norm"], totals, rtol=1e-4)


def test_a_failure_in_the_pre_step_hook_never_reaches_the_loop(tmp_path, monkeypatch):
    def broken(*args: object) -> None:
        raise RuntimeError("closure wrapping failed")

    monkeypatch.setattr("nbmonitor._capture.clock.after_closure", broken)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for _ in range(3):
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step(lambda: None)  # must not raise
            opt.zero_grad()
        mon.flush()
        assert mon.step == 3
        assert mon.history()["step"].tolist() == [1.0, 2.0, 3.0]
        assert any("hook:optimizer_pre_step" in e and "closure wrapping" in e for e in mon.errors)
