"""bqplot figures for users to compose: ``mon.figure(...)`` and ``nbmonitor.compare``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor._engine.frame import Series
from nbmonitor.ui.compare import compare_figure
from nbmonitor.ui.figures import bq, metrics_figure  # type: ignore[attr-defined]


def series() -> dict[str, Series]:
    x = np.arange(1.0, 101.0)
    return {"loss": Series(x, 1 / x), "grad_norm": Series(x, np.full(100, 2.0))}


def test_a_figure_of_named_metrics_is_a_bqplot_figure() -> None:
    fig = metrics_figure(series(), ("loss", "grad_norm"), log=True)
    assert isinstance(fig, bq.Figure)
    assert [m.labels[0] for m in fig.marks] == ["loss", "grad_norm"]
    assert fig.marks[0].x.dtype == np.float32 and len(fig.marks[0].x) == 100
    assert isinstance(fig.axes[1].scale, bq.LogScale)
    # The legend is outside the plot area: the right margin holds it.
    assert fig.fig_margin["right"] >= 100


def test_an_unknown_metric_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no series lr; known: grad_norm, loss"):
        metrics_figure(series(), ("loss", "lr"))
    with pytest.raises(ValueError, match="name the metrics"):
        metrics_figure(series(), ())


def test_compare_overlays_runs() -> None:
    fig = compare_figure({"a": series()["loss"], "b": series()["grad_norm"]}, "loss")
    assert fig.title == "loss by run" and len(fig.marks) == 2


def test_mon_figure_draws_the_run_so_far(tmp_path: object) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(5):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log(loss=loss)
        mon.flush()
        fig = mon.figure("loss", "grad_norm")
    assert [m.labels[0] for m in fig.marks] == ["loss", "grad_norm"]
    assert len(fig.marks[0].y) >= 4  # the last step may still be open
