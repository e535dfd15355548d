"""The engine in a notebook: dashboards shown, replaced on re-attach, views kept in sync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor.ui.dashboard import Dashboard


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Pretend to run in a kernel; collect what would be displayed."""
    shown: list[Any] = []
    monkeypatch.setattr("nbmonitor.ui.notebook.in_notebook", lambda: True)
    monkeypatch.setattr("nbmonitor.ui.notebook.show", shown.append)
    return shown


def test_attach_shows_a_dashboard_fed_by_the_sampler(notebook, tmp_path: Path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60) as mon:
        assert len(notebook) == 1 and isinstance(notebook[0], Dashboard)
        train(model, opt, mon, 5)
        mon.flush()
        frame = notebook[0].last_frame
        assert frame is not None and frame.step == 5 and frame.status == "running"
        assert frame.layers is not None and len(frame.layers.names) == 6
    assert notebook[0].closed and notebook[0].last_frame.status == "closed"


def test_reattach_closes_the_old_dashboard_feed(notebook, tmp_path: Path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60)
    second = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60)
    try:
        old, new = notebook
        assert old is not new
        assert old.closed and old.last_frame.status == "closed"
        assert not new.closed
        train(model, opt, second, 2)
        second.flush()
        assert new.last_frame.step == 2
        assert old.last_frame.step == 0  # the old view gets no more frames
        assert first.status == "closed"
    finally:
        second.close()


def test_display_false_shows_nothing_until_asked(notebook, tmp_path: Path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60, display=False) as mon:
        assert notebook == []
        assert mon.views == ()
        train(model, opt, mon, 3)
        dashboard = mon.dashboard()
        assert mon.dashboard() is dashboard  # one feed, however many views show it
        bundle = mon._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert "text/html" in bundle and "text/plain" in bundle
        mon.flush()
        assert dashboard.last_frame.step == 3
