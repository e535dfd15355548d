"""The time rules on synthetic step times and phases, and a loop fed by a slow DataLoader."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

import nbmonitor
from nbmonitor.health import Health, HealthInput
from nbmonitor.health.rules.time import REGRESSION_SUSTAIN_S


def timing(n: int, step_time: float | np.ndarray, data: float, optimizer: float) -> HealthInput:
    steps = np.arange(1.0, n + 1)
    total = np.broadcast_to(np.asarray(step_time, dtype=np.float64), (n,)).copy()
    columns = {
        "step": steps,
        "step_time": total,
        "phase_data_s": data * total,
        "phase_optimizer_s": optimizer * total,
    }
    return HealthInput(step=n, time=0.0, steps=columns)


def rules(alerts: list[nbmonitor.Alert]) -> list[str]:
    return [a.rule for a in alerts]


def test_input_bound_when_a_third_of_each_step_waits_for_data() -> None:
    alerts = Health().check(timing(60, 0.1, data=0.5, optimizer=0.1))
    assert rules(alerts) == ["input_bound"]
    assert "Input-bound: 50% of each step waits for data" in alerts[0].message
    assert "num_workers" in alerts[0].message and "pin_memory" in alerts[0].message
    assert alerts[0].subject == "run"


def test_not_input_bound_below_the_share_or_in_a_toy_loop() -> None:
    assert Health().check(timing(60, 0.1, data=0.1, optimizer=0.1)) == []
    # Half of a 1 ms step is 0.5 ms of data: a toy loop making random batches, not a loader.
    assert Health().check(timing(60, 0.001, data=0.5, optimizer=0.1)) == []
    # Too few steps to judge.
    assert Health().check(timing(5, 0.1, data=0.9, optimizer=0.0)) == []


def test_the_optimizer_share() -> None:
    alerts = Health().check(timing(60, 0.1, data=0.0, optimizer=0.6))
    assert rules(alerts) == ["optimizer_share"]
    assert "The optimizer takes 60% of the step" in alerts[0].message
    assert Health().check(timing(60, 0.1, data=0.0, optimizer=0.2)) == []


def test_a_step_time_regression_must_last() -> None:
    health = Health()
    fast, slow = np.full(100, 0.05), np.full(100, 0.2)
    assert health.check(timing(100, fast, 0.0, 0.0)) == []

    def at(n: int, when: float) -> HealthInput:
        inp = timing(n, np.concatenate((fast, slow))[:n], 0.0, 0.0)
        return HealthInput(step=n, time=when, steps=inp.steps)

    assert health.check(at(160, 100.0)) == []  # slower, but only just now
    assert health.check(at(170, 100.0 + REGRESSION_SUSTAIN_S / 2)) == []
    alerts = health.check(at(180, 101.0 + REGRESSION_SUSTAIN_S))
    assert rules(alerts) == ["step_time_regression"]
    assert "200 ms per step now" in alerts[0].message and "50 ms earlier" in alerts[0].message


def test_noise_is_no_regression() -> None:
    rng = np.random.default_rng(0)
    noisy = 0.05 * rng.lognormal(0, 0.3, 400)
    health = Health()
    for n, when in ((100, 0.0), (200, 40.0), (300, 80.0), (400, 120.0)):
        inp = timing(n, noisy[:n], 0.1, 0.1)
        assert health.check(HealthInput(step=n, time=when, steps=inp.steps)) == []


class SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.005)  # a slow decode, in the loop's own process (num_workers=0)
        return torch.randn(8), torch.randn(1)


def test_a_loop_with_a_slow_dataloader_is_diagnosed_input_bound(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=2)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for x, y in loader:  # 32 steps, each waiting ~10 ms for its batch
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        h = mon.history()
        alerts = [a for a in mon.events() if a.rule == "input_bound"]
    assert np.median(h["phase_data_s"][1:]) >= 0.009
    assert len(alerts) == 1, [a.message for a in mon.events()]
    assert "waits for data" in alerts[0].message
