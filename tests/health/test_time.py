"""The time rules on synthetic step times and phases (with a competing process's noise), and
loops fed by a slow DataLoader or stepped by a slow optimizer."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor.health import Health, HealthInput
from nbmonitor.health.rules.time import (
    PERSIST_STEPS,
    REGRESSION_SUSTAIN_S,
    optimizer_suggestion,
)
from nbmonitor.health.slices import GRID_STEPS
from nbmonitor.records import OptimizerRecord

FOR_LOOP_ADAM = OptimizerRecord(0, "Adam", "cpu", "for-loop", can_fuse=True, can_foreach=True)
FUSED_ADAM = OptimizerRecord(0, "Adam", "cpu", "fused", can_fuse=True, can_foreach=True)
CUDA_RMSPROP = OptimizerRecord(0, "RMSprop", "cuda", "foreach", can_fuse=False, can_foreach=True)
CPU_RMSPROP = OptimizerRecord(0, "RMSprop", "cpu", "for-loop", can_fuse=False, can_foreach=True)
OTHER = OptimizerRecord(0, "Lion", "cuda", "unknown", can_fuse=False, can_foreach=False)


def timing(
    n: int,
    step_time: float | np.ndarray,
    data: float | np.ndarray,
    optimizer: float | np.ndarray,
    kind: OptimizerRecord | None = FOR_LOOP_ADAM,
) -> HealthInput:
    """``n`` steps whose data wait and optimizer step are the given shares of each step."""
    steps = np.arange(1.0, n + 1)
    total = np.broadcast_to(np.asarray(step_time, dtype=np.float64), (n,)).copy()
    columns = {
        "step": steps,
        "step_time": total,
        "phase_data_s": np.asarray(data) * total,
        "phase_optimizer_s": np.asarray(optimizer) * total,
    }
    return HealthInput(step=n, time=0.0, steps=columns, optimizer=kind)


def rules(alerts: list[nbmonitor.Alert]) -> list[str]:
    return [a.rule for a in alerts]


def upto(inp: HealthInput, n: int) -> HealthInput:
    """The first ``n`` steps of ``inp``, as a check after step ``n`` sees them."""
    return dataclasses.replace(inp, step=n, steps={k: v[:n] for k, v in inp.steps.items()})


def test_input_bound_when_a_third_of_each_step_waits_for_data() -> None:
    alerts = Health().check(timing(200, 0.1, data=0.5, optimizer=0.1))
    assert rules(alerts) == ["input_bound"]
    assert "Input-bound: 50% of each step waits for data" in alerts[0].message
    assert "num_workers" in alerts[0].message and "pin_memory" in alerts[0].message
    assert alerts[0].subject == "run"


def test_not_input_bound_below_the_share_or_in_a_toy_loop() -> None:
    assert Health().check(timing(200, 0.1, data=0.1, optimizer=0.1)) == []
    # Half of a 1 ms step is 0.5 ms of data: a toy loop making random batches, not a loader.
    assert Health().check(timing(200, 0.001, data=0.5, optimizer=0.1)) == []
    # Too few steps to judge.
    assert Health().check(timing(5, 0.1, data=0.9, optimizer=0.0)) == []


def test_a_share_verdict_must_persist() -> None:
    run = timing(400, 0.1, data=0.5, optimizer=0.1)
    health = Health()
    # Judged at the grid points (every GRID_STEPS steps): first found at step 16, said at the
    # first grid point PERSIST_STEPS after it.
    said = 16 + math.ceil(PERSIST_STEPS / GRID_STEPS) * GRID_STEPS
    for n in range(GRID_STEPS, said, GRID_STEPS):
        assert health.check(upto(run, n)) == [], n
    alerts = health.check(upto(run, said))
    assert rules(alerts) == ["input_bound"] and alerts[0].step == said


def test_a_check_that_finds_it_clear_starts_the_count_again() -> None:
    data_s = np.full(400, 0.05)  # 50 ms of each 100 ms step waits for data ...
    data_s[80:130] = 0.0  # ... but for 50 steps (a whole window) that do not wait
    total = 0.05 + data_s
    run = timing(400, total, data=data_s / total, optimizer=0.1)
    health = Health()
    for n in range(GRID_STEPS, 400, GRID_STEPS):
        got = rules(health.check(upto(run, n)))
        # Held from step 16 until the quiet steps fill over a quarter of the window (clear at
        # step 96, before it would have been said), held again once they have left it
        # (step 176): said at the first grid point PERSIST_STEPS after that.
        assert got == (["input_bound"] if n == 176 + 112 else []), (n, got)


def test_the_optimizer_share_suggests_fused_to_a_for_loop_optimizer() -> None:
    alerts = Health().check(timing(200, 0.1, data=0.0, optimizer=0.6))
    assert rules(alerts) == ["optimizer_share"]
    message = alerts[0].message
    assert "The optimizer takes 60% of the step" in message
    assert "Adam updates its tensors one by one in a Python loop" in message
    assert "torch.optim.Adam(..., fused=True)" in message
    assert alerts[0].severity == "info" and alerts[0].subject == "run"
    assert Health().check(timing(200, 0.1, data=0.0, optimizer=0.4)) == []
    # A CPU RMSprop has no fused implementation: foreach.
    alerts = Health().check(timing(200, 0.1, data=0.0, optimizer=0.6, kind=CPU_RMSPROP))
    assert "torch.optim.RMSprop(..., foreach=True)" in alerts[0].message


def test_the_monitors_own_busy_spells_do_not_count_towards_a_share() -> None:
    # A for-loop optimizer at 30 % of a 10 ms step, 70 % on the steps that overlapped the
    # sampler's ticks (they waited for the interpreter): every other step of the run's last
    # stretch, so that the fastest quarter alone cannot drop them.
    n = 400
    share = np.full(n, 0.3)
    total = np.full(n, 0.01)
    share[::2] = 0.7
    total[::2] = 0.0093  # the contended steps are not slower: a quarter by speed keeps them
    inp = timing(n, total, data=0.0, optimizer=share)
    ends = np.cumsum(total)
    steps = {**inp.steps, "time": ends}
    spells = tuple(
        (float(e - t + 1e-4), float(e - 1e-4)) for e, t in zip(ends[::2], total[::2], strict=True)
    )
    contended = dataclasses.replace(inp, steps=steps)
    assert rules(Health().check(contended)) == ["optimizer_share"]
    apart = dataclasses.replace(contended, monitor_busy=spells)
    assert Health().check(apart) == []
    # The spell still running (its end unknown) counts too.
    running = dataclasses.replace(contended, monitor_busy=((0.0, math.inf),))
    assert Health().check(running) == []  # no step ran apart from it: nothing judged


@pytest.mark.parametrize(
    "kind",
    [FUSED_ADAM, CUDA_RMSPROP, OTHER, None],
    ids=["already-fused", "foreach-without-fused", "unknown-class", "not-recorded"],
)
def test_the_optimizer_share_is_silent_with_nothing_to_suggest(
    kind: OptimizerRecord | None,
) -> None:
    assert optimizer_suggestion(kind) is None
    assert Health().check(timing(400, 0.1, data=0.0, optimizer=0.9, kind=kind)) == []


def test_optimizer_suggestions() -> None:
    assert optimizer_suggestion(FOR_LOOP_ADAM) == "fused=True"
    cuda_adam = dataclasses.replace(FOR_LOOP_ADAM, device="cuda", implementation="foreach")
    assert optimizer_suggestion(cuda_adam) == "fused=True"
    assert optimizer_suggestion(CPU_RMSPROP) == "foreach=True"


def busy_neighbour(
    n: int, data: float, optimizer: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step times and phases of a loop beside a CPU-bound process: on a random half of the
    steps the loop is preempted for a scheduler slice or two, inside whichever phase was
    running then (chosen in proportion to the time each phase takes)."""
    rng = np.random.default_rng(seed)
    base = 0.01 * rng.lognormal(0.0, 0.05, n)
    shares = np.array([data, optimizer, 1.0 - data - optimizer])
    phases = base[:, None] * shares[None, :]
    hit = rng.random(n) < 0.5
    where = rng.choice(3, size=n, p=shares)
    phases[hit, where[hit]] += rng.choice([0.004, 0.008], size=int(hit.sum()))
    total = phases.sum(axis=1)
    return total, phases[:, 0], phases[:, 1]


def noisy(n: int, data: float, optimizer: float, seed: int) -> HealthInput:
    total, data_s, opt_s = busy_neighbour(n, data, optimizer, seed)
    return timing(n, total, data_s / total, opt_s / total)


@pytest.mark.parametrize("seed", range(5))
def test_a_busy_neighbour_raises_nothing_on_a_healthy_loop(seed: int) -> None:
    # The optimizer just under half of the step (a small model with a for-loop Adam, as in
    # the diagnosis benchmark) and a fair data wait: the preemptions push single steps' shares
    # well past the limits, the run's own lower quartiles do not move.
    run = noisy(2000, data=0.2, optimizer=0.45, seed=seed)
    shares = run.steps["phase_optimizer_s"] / run.steps["step_time"]
    assert (shares >= 0.5).mean() > 0.2  # single steps do look optimizer-bound
    health = Health()
    for n in range(100, 2001, 100):
        assert health.check(upto(run, n)) == [], n


@pytest.mark.parametrize("seed", range(3))
def test_a_busy_neighbour_does_not_hide_a_real_verdict(seed: int) -> None:
    run = noisy(1000, data=0.4, optimizer=0.55, seed=seed)
    assert sorted(rules(Health().check(run))) == ["input_bound", "optimizer_share"]


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
    noisy_times = 0.05 * rng.lognormal(0, 0.3, 400)
    health = Health()
    for n, when in ((100, 0.0), (200, 40.0), (300, 80.0), (400, 120.0)):
        inp = timing(n, noisy_times[:n], 0.1, 0.1)
        assert health.check(HealthInput(step=n, time=when, steps=inp.steps)) == []


def test_a_neighbour_slowing_half_the_steps_is_no_regression() -> None:
    # From step 100 on, half of the steps are three times slower (the median doubles) for
    # minutes: the run's fast steps are as fast as ever.
    rng = np.random.default_rng(1)
    times = np.full(2000, 0.05)
    later = np.arange(2000) >= 100
    times[later & (rng.random(2000) < 0.5)] = 0.15
    health = Health()
    for i, n in enumerate(range(100, 2001, 50)):
        inp = timing(n, times[:n], 0.0, 0.0)
        assert health.check(HealthInput(step=n, time=10.0 * i, steps=inp.steps)) == [], n


class SlowDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 320

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.005)  # a slow decode, in the loop's own process (num_workers=0)
        return torch.randn(8), torch.randn(1)


def test_a_loop_with_a_slow_dataloader_is_diagnosed_input_bound(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(SlowDataset(), batch_size=2)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for x, y in loader:  # 160 steps, each waiting ~10 ms (or more) for its batch
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        h = mon.history()
        alerts = [a for a in mon.events() if a.rule == "input_bound"]
    assert np.median(h["phase_data_s"][1:]) >= 0.009  # sleep() waits at least as long
    assert len(alerts) == 1, [a.message for a in mon.events()]
    assert "waits for data" in alerts[0].message


class ManyTensors(torch.nn.Module):
    """200 tiny parameter tensors that the forward stacks in one call: a for-loop optimizer
    spends its step on Python, one tensor at a time, while forward and backward are cheap."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(4)) for _ in range(200))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ torch.stack(tuple(self.rows)).T


def optimizer_bound(tmp_path: Path, adopt: bool = False, **adam: bool) -> list[nbmonitor.Alert]:
    torch.manual_seed(0)
    model = ManyTensors()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, **adam)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        given = None if adopt else opt  # adopted at its first step when not given
        with nbmonitor.attach(model, given, run_dir=tmp_path, display=False, interval=60) as mon:
            for _ in range(300):
                x = torch.randn(8, 4)
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            mon.flush()
            return [a for a in mon.events() if a.rule == "optimizer_share"]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("adopt", [False, True], ids=["given", "adopted"])
def test_a_for_loop_optimizer_on_many_tensors_is_told_to_fuse(tmp_path: Path, adopt: bool) -> None:
    alerts = optimizer_bound(tmp_path, adopt, foreach=False)
    assert len(alerts) == 1
    assert "torch.optim.Adam(..., fused=True)" in alerts[0].message


def test_a_fused_optimizer_is_told_nothing(tmp_path: Path) -> None:
    assert optimizer_bound(tmp_path, fused=True) == []
