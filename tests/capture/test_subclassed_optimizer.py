"""An optimizer subclass whose step() calls super().step(): torch runs the step hooks of both
patched classes, once per class; nbmonitor still counts one step per step."""

from __future__ import annotations

import math

import pytest
import torch

import nbmonitor


class CountingAdam(torch.optim.Adam):
    def step(self, closure=None):  # type: ignore[no-untyped-def]
        return super().step(closure)


class RaisingOnce(torch.optim.SGD):
    raised = False

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        if not RaisingOnce.raised:
            RaisingOnce.raised = True
            raise RuntimeError("a step that fails once")
        return super().step(closure)


def _loop(model, opt, mon, n):  # type: ignore[no-untyped-def]
    norms = []
    for _ in range(n):
        loss = model(torch.randn(4, 4)).pow(2).mean()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
    return norms


def test_a_subclass_calling_super_step_counts_one_step(tmp_path):
    torch.optim.Adam(torch.nn.Linear(2, 2).parameters())  # Adam.step is patched too now
    model = torch.nn.Linear(4, 1)
    opt = CountingAdam(model.parameters())
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        norms = _loop(model, opt, mon, 3)
        mon.flush()
        assert mon.step == 3
        h = mon.history()
        assert h["step"].tolist() == [1.0, 2.0, 3.0]
        assert all(
            math.isclose(a, b, rel_tol=1e-4) for a, b in zip(h["grad_norm"], norms, strict=True)
        )


def test_a_step_that_raised_does_not_stop_the_count(tmp_path):
    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    model = torch.nn.Linear(4, 1)
    opt = RaisingOnce(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        with pytest.raises(RuntimeError, match="fails once"):
            _loop(model, opt, mon, 1)
        opt.zero_grad()
        _loop(model, opt, mon, 3)
        mon.flush()
        assert mon.step == 3
