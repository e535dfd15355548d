"""Step phases with a fake host clock: each phase gets exactly the time spent in it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor.live.monitor import Monitor
from nbmonitor.records import PHASE_KEYS

DATA, FORWARD, BACKWARD, OTHER, OPTIMIZER = 0.020, 0.010, 0.030, 0.002, 0.005


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: FakeClock) -> torch.Tensor:  # type: ignore[override]
        ctx.clock = clock
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.clock.advance(BACKWARD)
        return grad, None


class Timed(torch.nn.Module):
    """A model whose forward and backward each take a known time on the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.lin = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.advance(FORWARD)
        return _SlowBackward.apply(self.lin(x), self.clock)  # type: ignore[no-any-return]


def run(tmp_path: Path, steps: int, micro: int = 1, optimizer: bool = True, **kw: Any) -> Any:
    clock = FakeClock()
    model = Timed(clock)
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer else None
    mon = Monitor(model, opt, run_dir=tmp_path, display=False, interval=60, timer=clock, **kw)
    mon.start()
    if opt is not None:
        # Registered after nbmonitor's: it runs once the optimizer phase has begun. (A subclass
        # overriding step() would do, but torch runs the hooks twice for one that calls
        # super().step() once the parent class has been patched by another instance.)
        opt.register_step_pre_hook(lambda *_: clock.advance(OPTIMIZER))
    try:
        for _ in range(steps):
            for _ in range(micro):
                clock.advance(DATA)
                model(torch.randn(2, 4)).pow(2).mean().backward()
            if opt is not None:
                clock.advance(OTHER)
                opt.step()
                opt.zero_grad()
            else:  # by hand: the gradients reset between steps (else they accumulate)
                model.zero_grad()
        mon.flush()
        return mon.history()
    finally:
        mon.close()


def test_each_phase_gets_the_time_spent_in_it(tmp_path: Path) -> None:
    h = run(tmp_path, 4)
    expected = [DATA, FORWARD, BACKWARD, OTHER, OPTIMIZER]
    for key, value in zip(PHASE_KEYS, expected, strict=True):
        # Step 1 starts at its forward: its wait for data is unknown (NaN, not 0).
        want = [math.nan if key == "phase_data_s" else value] + [value] * 3
        assert h[key] == pytest.approx(want, abs=1e-9, nan_ok=True), key
    # The phases add up to the step time.
    total = sum(np.nan_to_num(h[key]) for key in PHASE_KEYS)
    np.testing.assert_allclose(total, h["step_time"], atol=1e-9)
    assert h["step_time"][1:] == pytest.approx([sum(expected)] * 3)


def test_micro_batches_add_up(tmp_path: Path) -> None:
    h = run(tmp_path, 3, micro=2)
    assert h["phase_data_s"][1:] == pytest.approx([2 * DATA] * 2)
    # The first step's wait before its first micro-batch is unknown: no data time for it.
    assert math.isnan(h["phase_data_s"][0])
    assert h["phase_forward_s"] == pytest.approx([2 * FORWARD] * 3)
    assert h["phase_backward_s"] == pytest.approx([2 * BACKWARD] * 3)
    assert h["phase_other_s"] == pytest.approx([OTHER] * 3)
    assert h["phase_optimizer_s"] == pytest.approx([OPTIMIZER] * 3)


def test_without_an_optimizer_a_step_ends_with_its_backward(tmp_path: Path) -> None:
    h = run(tmp_path, 3, optimizer=False)
    assert h["phase_data_s"][1:] == pytest.approx([DATA] * 2)
    assert h["phase_forward_s"] == pytest.approx([FORWARD] * 3)
    assert h["phase_backward_s"] == pytest.approx([BACKWARD] * 3)
    assert h["phase_optimizer_s"] == pytest.approx([0.0] * 3)


def test_phases_off_records_none(tmp_path: Path) -> None:
    h = run(tmp_path, 2, phases=False)
    assert not any(key in h for key in PHASE_KEYS)
    assert len(h["step"]) == 2


def test_phase_columns_cannot_be_logged_over(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    with (
        nbmonitor.attach(model, None, run_dir=tmp_path, display=False) as mon,
        pytest.raises(TypeError, match="phase_data_s"),
    ):
        mon.log(phase_data_s=1.0)


def test_a_failing_phase_timer_costs_only_the_phases(tmp_path: Path, monkeypatch: Any) -> None:
    from nbmonitor._capture.phases import PhaseTimer

    def broken(self: PhaseTimer, kind: int) -> None:
        raise RuntimeError("no events today")

    monkeypatch.setattr(PhaseTimer, "_mark_event", broken)
    monkeypatch.setattr(PhaseTimer, "__init__", _init_cuda(PhaseTimer.__init__))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        h = mon.history()
        errors = mon.errors
    assert h["step"].tolist() == [1.0, 2.0, 3.0]
    assert not any(key in h for key in PHASE_KEYS)
    assert any("probe:phases" in e and "no events today" in e for e in errors)


def _init_cuda(init: Any) -> Any:
    def patched(
        self: Any, guard: Any, clock: Any, cuda: bool = False, enabled: bool = True
    ) -> None:
        init(self, guard, clock, cuda=True, enabled=enabled, device_every=1)

    return patched


def _accumulate_hooks(model: torch.nn.Module) -> int:
    return sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def test_after_one_backward_one_parameter_marks_its_end_and_close_removes_it(
    tmp_path: Path,
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        assert _accumulate_hooks(model) == 4  # learning which gradient lands last
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        # The first layer's gradients land last; one of them now marks the backward's end.
        assert _accumulate_hooks(model) == 1
        assert _accumulate_hooks(model[0]) == 1
        mon.flush()
        h = mon.history()
    assert _accumulate_hooks(model) == 0
    assert np.all(h["phase_backward_s"] > 0) and np.all(h["phase_other_s"] > 0)


class _FakeEvent:
    def __init__(self, t_ms: float, done: bool = True) -> None:
        self.t_ms, self.done = t_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: _FakeEvent) -> float:
        return end.t_ms - self.t_ms


def test_cuda_intervals_sum_by_phase_once_the_last_event_completed() -> None:
    from nbmonitor._capture.phases import DATA, FORWARD, OPTIMIZER, OTHER, EventIntervals

    events = [_FakeEvent(t) for t in (0.0, 20.0, 30.0, 50.0, 60.0)]
    phases = [DATA, FORWARD, OTHER, OPTIMIZER]
    pending = EventIntervals(events, phases)
    assert pending.ready()
    assert pending.values() == pytest.approx([0.020, 0.010, 0.0, 0.020, 0.010])
    events[-1].done = False
    assert not pending.ready()  # the sampler leaves the step's record for a later tick
    first = EventIntervals(events, phases, first=True)
    assert math.isnan(first.values()[0]) and first.values()[1] == pytest.approx(0.010)


def _durations(durations: Any) -> list[float]:
    assert durations is not None and not isinstance(durations, tuple)
    values: list[float] = durations.values()
    return values


class _RecordedEvent:
    """A fake CUDA timing event: record() takes the time of a fake device clock."""

    made = 0

    def __init__(self, now: list[float]) -> None:
        type(self).made += 1
        self._now = now
        self.t_ms = math.nan

    def record(self) -> None:
        self.t_ms = self._now[0]

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _RecordedEvent) -> float:
        return end.t_ms - self.t_ms


def test_cuda_events_are_recorded_again_once_the_sampler_has_read_their_step() -> None:
    from nbmonitor._capture.phases import (
        BACKWARD_END,
        FORWARD_END,
        FORWARD_START,
        OPTIMIZER_START,
        PhaseTimer,
    )
    from nbmonitor.errors import ErrorLog, Guard

    now = [0.0]
    _RecordedEvent.made = 0
    timer = PhaseTimer(
        Guard("probe:phases", ErrorLog()),
        lambda: now[0] / 1000.0,  # the host clock (the wait for data before the first event)
        cuda=True,
        new_event=lambda: _RecordedEvent(now),
        device_every=1,
    )
    records: list[Any] = []
    steps = 50
    for step in range(1, steps + 1):
        # data 1 ms, forward 2, backward 3, other 1 (the marks' order), optimizer 4
        for kind, ms in ((FORWARD_START, 1), (FORWARD_END, 2), (BACKWARD_END, 3)):
            now[0] += ms
            timer.mark(kind)
        now[0] += 1
        timer.mark(OPTIMIZER_START)
        now[0] += 4
        records.append(timer.step_end(step, now[0] / 1000.0))
        values = _durations(records[-1])  # the sampler reads each step as it completes
        assert values[1:] == pytest.approx([0.002, 0.003, 0.001, 0.004])
        assert step == 1 or values[0] == pytest.approx(0.001)
    # Five marks a step and its first event: all recorded again once read.
    assert _RecordedEvent.made <= 12
    assert _durations(records[0]) == _durations(records[0])  # read once, kept


def test_on_cuda_one_step_in_device_every_is_timed_with_events_the_others_on_the_host() -> None:
    from nbmonitor._capture.phases import (
        BACKWARD_END,
        DEVICE_EVERY,
        FORWARD_END,
        FORWARD_START,
        OPTIMIZER_START,
        EventIntervals,
        PhaseTimer,
    )
    from nbmonitor.errors import ErrorLog, Guard

    now = [0.0]  # ms, one clock for the host and the fake device
    _RecordedEvent.made = 0
    timer = PhaseTimer(
        Guard("probe:phases", ErrorLog()),
        lambda: now[0] / 1000.0,
        cuda=True,
        new_event=lambda: _RecordedEvent(now),
    )
    kinds: list[type] = []
    for step in range(1, 3 * DEVICE_EVERY + 1):
        made = _RecordedEvent.made
        for kind, ms in ((FORWARD_START, 1), (FORWARD_END, 2), (BACKWARD_END, 3)):
            now[0] += ms
            timer.mark(kind)
        now[0] += 1
        timer.mark(OPTIMIZER_START)
        now[0] += 4
        durations = timer.step_end(step, now[0] / 1000.0)
        assert durations is not None
        kinds.append(type(durations))
        values = list(durations) if isinstance(durations, tuple) else durations.values()
        assert values[1:] == pytest.approx([0.002, 0.003, 0.001, 0.004])
        assert step == 1 or values[0] == pytest.approx(0.001)
        on_device = step % DEVICE_EVERY == 0
        # Events on the steps timed on the device only (five marks), recorded again after.
        assert (_RecordedEvent.made > made) == (on_device and step == DEVICE_EVERY)
    assert [k is EventIntervals for k in kinds] == [
        s % DEVICE_EVERY == 0 for s in range(1, 3 * DEVICE_EVERY + 1)
    ]


def test_the_time_panel_says_which_steps_were_timed_on_the_device(tmp_path: Path) -> None:
    import json

    from nbmonitor._engine.frame_builder import _timeline
    from nbmonitor._engine.run_state import run_info
    from nbmonitor.ui.panels.timeline import timeline_state

    # meta.json says it (a CPU run: on the host clock only), and a replay reads it back.
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        run_dir = mon.run_dir
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["phases"] == {"device_every": 0}
    assert run_info({"phases": {"device_every": 16}}, "r").phases_device_every == 16
    for bad in (None, {"device_every": True}, {"device_every": -3}, {"device_every": "16"}, 7):
        assert run_info({"phases": bad}, "r").phases_device_every == 0
    # The frame's timeline carries it, and the panel's state hands it to the page.
    from nbmonitor._engine.store import Store

    steps = Store()
    for s in range(1, 40):
        steps.append({"step": float(s), **{k: 0.001 for k in PHASE_KEYS}})
    timeline = _timeline(steps, None, 0.0, 16)
    assert timeline is not None and timeline.device_every == 16
    assert timeline_state(timeline)["device_every"] == 16
