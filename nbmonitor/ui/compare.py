"""One figure overlaying a metric of several runs (``nbmonitor.compare``): a line per run,
decimated like the dashboard's, with a legend."""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as widgets
import numpy as np

from nbmonitor._engine.frame import Series
from nbmonitor.ui.figures import bq  # type: ignore[attr-defined]  # imported there quietly

# Distinguishable lines for up to ten runs, then the colours repeat.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def compare_figure(lines: Mapping[str, Series], metric: str, log: bool = False) -> bq.Figure:
    """A bqplot Figure with one line per run (name -> its series of ``metric``)."""
    x_scale = bq.LinearScale()
    y_scale = bq.LogScale() if log else bq.LinearScale()
    marks = []
    for i, (name, series) in enumerate(lines.items()):
        y = series.y
        if log:
            y = np.where(y > 0, y, np.nan)
        marks.append(
            bq.Lines(
                x=np.asarray(series.x, dtype=np.float32),
                y=np.asarray(y, dtype=np.float32),
                scales={"x": x_scale, "y": y_scale},
                colors=[PALETTE[i % len(PALETTE)]],
                labels=[name],
                display_legend=True,
                stroke_width=1.5,
            )
        )
    axes = [
        bq.Axis(scale=x_scale, side="bottom", label="step", tick_format="~s", grid_lines="dashed"),
        bq.Axis(scale=y_scale, side="left", label=metric, tick_format=".3~g", grid_lines="dashed"),
    ]
    figure = bq.Figure(
        marks=marks,
        axes=axes,
        title=f"{metric} by run",
        legend_location="top-right",
        fig_margin={"top": 40, "bottom": 40, "left": 64, "right": 16},
        animation_duration=0,
        layout=widgets.Layout(height="320px", width="auto"),
    )
    figure.interaction = bq.interacts.PanZoom(scales={"x": [x_scale], "y": [y_scale]})
    return figure
