"""bqplot figures for users who want a figure to compose: ``mon.figure("loss", "grad_norm")``
and ``nbmonitor.compare``. The dashboard does not use bqplot (its charts are our own canvas
charts, ``js/src/charts/``); a bqplot Figure is an ipywidget that users put in their own layouts.

bqplot resends a whole array on every assignment, so only decimated series (the Frame's, ~2,000
points) are assigned, as float32.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import numpy as np

from nbmonitor._engine.frame import Series

# bqscales (bqplot's scales) passes trait metadata the pre-traitlets-4.1 way; the resulting
# DeprecationWarning at import is theirs, not the user's, and would fail warnings-as-errors test
# runs (ours and our users'). Silence exactly that message, only for the import.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", r"metadata \{.*\} was set from the constructor", DeprecationWarning
    )
    import bqplot as bq

# Distinguishable lines for up to ten, then the colours repeat.
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


def lines_figure(
    lines: Mapping[str, Series], title: str, y_label: str = "", log: bool = False
) -> bq.Figure:
    """A bqplot Figure with one line per entry (label -> series) against the step."""
    x_scale = bq.LinearScale()
    y_scale = bq.LogScale() if log else bq.LinearScale()
    marks = []
    for i, (label, series) in enumerate(lines.items()):
        n = min(len(series.x), len(series.y))
        y = np.asarray(series.y[:n], dtype=np.float64)
        if log:
            y = np.where(y > 0, y, np.nan)
        marks.append(
            bq.Lines(
                x=np.asarray(series.x[:n], dtype=np.float32),
                y=y.astype(np.float32),
                scales={"x": x_scale, "y": y_scale},
                colors=[PALETTE[i % len(PALETTE)]],
                labels=[label],
                display_legend=len(lines) > 1,
                stroke_width=1.5,
            )
        )
    axes = [
        bq.Axis(scale=x_scale, side="bottom", label="step", tick_format="~s", num_ticks=5),
        bq.Axis(scale=y_scale, side="left", label=y_label, tick_format=".2~s", num_ticks=4),
    ]
    figure = bq.Figure(
        marks=marks,
        axes=axes,
        title=title,
        # The legend sits right of the plot area, outside the data.
        legend_location="top-right",
        legend_style={"fill-opacity": "0.85", "stroke-width": "0"},
        fig_margin={"top": 40, "bottom": 40, "left": 64, "right": 140},
        animation_duration=0,
        layout=widgets.Layout(height="320px", width="auto"),
    )
    figure.interaction = bq.interacts.PanZoom(scales={"x": [x_scale], "y": [y_scale]})
    return figure


def metrics_figure(
    series: Mapping[str, Series], keys: Sequence[str], log: bool = False
) -> bq.Figure:
    """``mon.figure(*keys)``: the named metrics of one run in one figure."""
    if not keys:
        raise ValueError('nbmonitor: name the metrics to draw, e.g. mon.figure("loss")')
    missing = [key for key in keys if key not in series]
    if missing:
        known = ", ".join(sorted(series)) or "none yet"
        raise ValueError(f"nbmonitor: no series {', '.join(missing)}; known: {known}")
    return lines_figure({key: series[key] for key in keys}, ", ".join(keys), log=log)
