"""How much the gradient clip acts is shown: the share of recent steps it scaled and the latest
coefficient, in the frame's latest values, the console line and summary, the dashboard's
gradient-norm chart title and its static summary; a loop that does not clip shows none of it.
The monitored loops are real (clip_grad_norm_ on a tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._engine.frame import Frame
from nbmonitor.ui import Dashboard
from nbmonitor.ui.console import status_line, summary_text


def run(tmp_path: Path, max_norm: float | None, steps: int = 8) -> Frame:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for i in range(steps):
            # Odd steps (the last one too) have a gradient far above the clip, even ones far below.
            scale = 1e3 if i % 2 == 1 else 1e-3
            (model(torch.randn(4, 8)).pow(2).mean() * scale).backward()
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
            opt.zero_grad()
    return mon.frame()  # closed: every step stored


def test_a_loop_that_clips_shows_how_often_and_by_how_much(tmp_path: Path) -> None:
    frame = run(tmp_path, max_norm=1.0)
    latest = frame.latest
    assert latest["grad_clipped_fraction"] == pytest.approx(0.5)
    coef = latest["grad_clip_coef"]  # the last step's: 1 / its pre-clip norm
    assert coef == pytest.approx(1.0 / (latest["grad_norm"] + 1e-6), rel=1e-4)
    text = f"clipped on 50% of recent steps, coef {coef:.3g}"
    assert f"grad {latest['grad_norm']:.3g} (clipped 50%)" in status_line(frame)
    assert f"gradient norm {text}" in summary_text(frame)
    dash = Dashboard("clip", "cpu", None)
    dash.publish(frame)
    assert dash.widget.panel_training["notes"]["grad_norm"] == text  # the chart's title
    assert text in dash.summary_html()
    dash.close(frame)


def test_a_loop_that_does_not_clip_shows_no_clip(tmp_path: Path) -> None:
    frame = run(tmp_path, max_norm=None)
    assert "grad_clipped_fraction" not in frame.latest
    assert "clipped" not in status_line(frame) and "clipped" not in summary_text(frame)
    dash = Dashboard("plain", "cpu", None)
    dash.publish(frame)
    assert not dash.widget.panel_training["notes"]["grad_norm"]
    assert "clipped" not in dash.summary_html()
    dash.close(frame)
