"""A live run's dashboard steers it: a button's message (handed to the widget as ipywidgets
would) reaches the run's Steering, the bar says what the run does, and the lr chart marks the
learning rates asked (no kernel here: tests/test_busy_kernel.py and tests/ui/ have one)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp, wait_for

import nbmonitor
from nbmonitor.errors import StopTraining
from nbmonitor.ui.dashboard import Dashboard


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Pretend to run in a kernel; collect what would be displayed."""
    shown: list[Any] = []
    monkeypatch.setattr("nbmonitor.ui.notebook.in_notebook", lambda: True)
    monkeypatch.setattr("nbmonitor.ui.notebook.show", shown.append)
    return shown


def click(dash: Dashboard, kind: str, value: float | None = None) -> None:
    content: dict[str, Any] = {"type": "steer", "kind": kind}
    if value is not None:
        content["value"] = value
    dash.widget._handle_custom_msg(content, [])


def step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_the_lr_asked_from_the_dashboard_is_applied_and_marked(notebook, tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60) as mon:
        (dash,) = notebook
        assert dash.widget.steer["enabled"] is True
        for _ in range(3):
            step(model, opt)
        click(dash, "lr", 0.025)
        assert opt.param_groups[0]["lr"] == 0.1  # applied at the next boundary, not now
        step(model, opt)
        assert [g["lr"] for g in opt.param_groups] == [0.025]
        step(model, opt)
        mon.flush()
        marks = dash.widget.panel_training["marks"]["lr"]
        assert marks == [[4, 0.025]]
        sources = [a.evidence["source"] for a in mon.events() if a.rule == "steer"]
        assert sources == ["dashboard"]


def test_pause_resume_and_stop_of_a_loop_in_a_thread(notebook, tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ended: list[BaseException] = []

    def loop() -> None:
        try:
            for _ in range(100_000):
                step(model, opt)
        except StopTraining as exc:
            ended.append(exc)

    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05)
    (dash,) = notebook
    worker = threading.Thread(target=loop)
    worker.start()
    try:
        assert wait_for(lambda: mon.step >= 3)
        click(dash, "pause")
        assert wait_for(lambda: mon.steering.paused)
        held = mon.step
        assert wait_for(lambda: dash.widget.steer["state"] == "paused")
        assert dash.widget.steer["step"] == held
        assert not wait_for(lambda: mon.step > held, timeout=0.5)  # it waits
        click(dash, "resume")
        assert wait_for(lambda: mon.step > held + 2)
        click(dash, "stop")
        worker.join(timeout=60)
        assert not worker.is_alive() and len(ended) == 1
        assert nbmonitor.open(mon.run_dir).status == "stopped"
        assert dash.widget.steer == {"enabled": False, "state": "stopped", "step": ended[0].step}
        assert dash.widget.header["status"] == "stopped"  # as the run's folder says
    finally:
        mon.close()
        worker.join(timeout=60)


def test_a_paused_main_thread_loop_still_sends_on_the_main_route(
    notebook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Colab renders only what the main thread sends: a loop paused in the main thread sends
    the newest frame from where it waits (the steering's pump)."""
    monkeypatch.setenv("NBMONITOR_PUBLISH", "main")
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05) as mon:
        (dash,) = notebook
        assert dash.route == "main"
        step(model, opt)
        sent: list[int] = []

        def operator() -> None:
            assert wait_for(lambda: mon.steering.paused)
            sent.append(dash.sent_on_main)
            wait_for(lambda: dash.sent_on_main >= sent[0] + 3)
            sent.append(dash.sent_on_main)
            click(dash, "resume")

        click(dash, "pause")
        helper = threading.Thread(target=operator)
        helper.start()
        step(model, opt)  # waits at its end until the helper resumes it
        helper.join(timeout=60)
        assert len(sent) == 2 and sent[1] >= sent[0] + 3, sent
        assert mon.step == 2
    assert dash.last_frame.status == "closed"
