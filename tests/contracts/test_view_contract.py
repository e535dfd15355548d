"""Every view meets the View protocol: it takes a Frame built by the one FrameBuilder (a live
run's, or a replay's with empty stores) in publish() and close() without raising."""

from __future__ import annotations

import logging

import pytest

from nbmonitor._engine.frame import FrameState, RunInfo, View
from nbmonitor._engine.frame_builder import FrameBuilder
from nbmonitor._engine.run_model import RunModel
from nbmonitor.ui.console import ConsoleView


def views() -> list[View]:
    from nbmonitor.ui.dashboard import Dashboard

    return [ConsoleView(logging.getLogger("nbmonitor.test")), Dashboard("run", "cpu", 10)]


@pytest.mark.parametrize("rows", [0, 50])
def test_every_view_takes_frames_and_closes(rows: int) -> None:
    model = RunModel()
    model.add_step_rows([{"step": float(i), "loss": 1.0 / (i + 1)} for i in range(1, rows + 1)])
    builder = FrameBuilder(RunInfo("run", "cpu", 10), model)
    for view in views():
        assert isinstance(view.wants_detail, bool)
        detail = view.wants_detail
        view.publish(builder.build(FrameState("running", rows, 1.0), detail=detail))
        view.close(builder.build(FrameState("closed", rows, 2.0), detail=detail))
