"""The dashboard's steering controls, Python side: what a button's message becomes, and what
the bar says (no kernel: the widget's custom message is handed to it directly)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from tests.ui.test_dashboard import make_frame

from nbmonitor.ui import Dashboard
from nbmonitor.ui.steer_controls import (
    SteerHooks,
    SteerState,
    bar_state,
    is_steer_message,
    read_request,
)


class Run:
    """A stand-in for the run's steering: what the hooks were asked, and its state."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, float | None]] = []
        self.state = SteerState(paused=False, stopping=False, step=0)
        self.fail = False

    def request(self, kind: str, value: float | None) -> None:
        if self.fail:
            raise RuntimeError("the run's side failed")
        self.asked.append((kind, value))

    @property
    def hooks(self) -> SteerHooks:
        return SteerHooks(request=self.request, state=lambda: self.state)


def click(dash: Dashboard, content: Any) -> None:
    """What ipywidgets does with a front end's custom message: call the on_msg callbacks."""
    dash.widget._handle_custom_msg(content, [])


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"type": "steer", "kind": "pause"}, ("pause", None)),
        ({"type": "steer", "kind": "resume", "value": 3}, ("resume", None)),
        ({"type": "steer", "kind": "lr", "value": 0.001}, ("lr", 0.001)),
        ({"type": "steer", "kind": "lr", "value": "3e-4"}, ("lr", 3e-4)),
        ({"type": "steer", "kind": "lr", "value": 0}, None),
        ({"type": "steer", "kind": "lr", "value": "nan"}, None),
        ({"type": "steer", "kind": "lr", "value": math.inf}, None),
        ({"type": "steer", "kind": "lr", "value": True}, None),
        ({"type": "steer", "kind": "lr", "value": [1]}, None),
        ({"type": "steer", "kind": "lr"}, None),
        ({"type": "steer", "kind": "format_disk"}, None),
        ({"type": "other", "kind": "pause"}, None),
        ("pause", None),
        (None, None),
    ],
)
def test_read_request_accepts_only_well_formed_requests(content: Any, expected: Any) -> None:
    assert read_request(content) == expected


def test_is_steer_message_reads_ipywidgets_custom_envelope() -> None:
    assert is_steer_message({"method": "custom", "content": {"type": "steer", "kind": "stop"}})
    assert not is_steer_message({"method": "update", "state": {"type": "steer"}})
    assert not is_steer_message({"method": "custom", "content": "steer"})
    assert not is_steer_message(None)


def test_a_click_is_handed_to_the_run() -> None:
    run = Run()
    dash = Dashboard("test-run", "cpu", 1000, steer=run.hooks)
    assert dash.widget.steer == {"enabled": True, "state": "running", "step": 0}
    click(dash, {"type": "steer", "kind": "pause"})
    click(dash, {"type": "steer", "kind": "lr", "value": 0.01})
    click(dash, {"type": "steer", "kind": "nonsense"})
    assert run.asked == [("pause", None), ("lr", 0.01)]
    assert dash.steer_requests == 2


def test_a_failing_run_side_never_raises_into_the_kernel() -> None:
    run = Run()
    run.fail = True
    dash = Dashboard("test-run", "cpu", 1000, steer=run.hooks)
    click(dash, {"type": "steer", "kind": "stop"})  # no exception
    assert dash.steer_requests == 0


def test_the_bar_follows_the_run() -> None:
    run = Run()
    dash = Dashboard("test-run", "cpu", 1000, steer=run.hooks)
    run.state = SteerState(paused=True, stopping=False, step=41)
    dash.publish(make_frame(41))
    assert dash.widget.steer == {"enabled": True, "state": "paused", "step": 41}
    run.state = SteerState(paused=False, stopping=True, step=42)
    dash.publish(make_frame(42))
    assert dash.widget.steer["state"] == "stopping"
    dash.close(make_frame(42))
    assert dash.widget.steer == {"enabled": False, "state": "stopped", "step": 42}


def test_a_replay_has_no_controls() -> None:
    dash = Dashboard("test-run", "cpu", 1000)
    dash.publish(make_frame(5))
    assert dash.widget.steer["enabled"] is False
    click(dash, {"type": "steer", "kind": "pause"})  # ignored: nothing to steer
    assert dash.steer_requests == 0


def test_bar_state_words() -> None:
    state = SteerState(paused=False, stopping=False, step=3)
    assert bar_state(state, "closed") == {"enabled": False, "state": "closed", "step": 3}
    assert bar_state(state, "stopped")["state"] == "stopped"
    assert bar_state(None, "running") == {"enabled": False, "state": "", "step": None}


def test_the_training_panel_keeps_the_lr_marks_it_saw_bounded() -> None:
    from nbmonitor.health.alert import Alert
    from nbmonitor.ui.panels.training import MAX_MARKS, TrainingPanel

    def lr_alert(step: int, value: float, ok: bool = True) -> Alert:
        evidence = {"action": "lr", "value": value, "source": "dashboard", "ok": ok}
        return Alert("steer", "info", "lr", step, 0.0, evidence=evidence)

    panel = TrainingPanel()
    first = panel.state(make_frame(10, alerts=(lr_alert(3, 0.1), lr_alert(5, 0.2, ok=False))))
    assert first is not None and first["marks"] == {"lr": [[3, 0.1]]}
    # A later frame no longer carries the old alert: the mark stays.
    later = panel.state(make_frame(11, alerts=(lr_alert(9, 0.05),)))
    assert later is not None and later["marks"]["lr"] == [[3, 0.1], [9, 0.05]]
    many = tuple(lr_alert(100 + i, 0.01) for i in range(MAX_MARKS + 5))
    state = panel.state(make_frame(300, alerts=many))
    assert state is not None and len(state["marks"]["lr"]) == MAX_MARKS
    assert state["marks"]["lr"][0][0] == 105
    assert "marks" not in (TrainingPanel().state(make_frame(10)) or {})
