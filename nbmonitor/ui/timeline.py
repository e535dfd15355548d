"""The timeline panel: where the time goes.

Three parts, drawn from ``Frame.timeline``: the step phases stacked against the step (on the
curves' shared x scale, so a step-time spike lines up with the phase that grew), a gantt of the
last steps' phases and spans, and the telemetry summary table (count, mean, median, std, min,
max, total, % of run per phase and span, as Oumi's timers print it). Hidden until a frame has
phases or spans. Like the curves, it assigns only bounded arrays, and only when they changed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from typing import Any

import ipywidgets as widgets
import numpy as np

from nbmonitor._engine.frame import GanttBar, TimelineFrame
from nbmonitor.ui.figures import bq  # type: ignore[attr-defined]  # imported there quietly

PHASE_COLORS = {
    "data": "#d62728",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "other": "#7f7f7f",
    "optimizer": "#2ca02c",
}
SPAN_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
MAX_BARS = 300
_LAYOUT = {"height": "240px", "width": "auto", "min_width": "300px"}
_MARGIN = {"top": 36, "bottom": 36, "left": 56, "right": 16}
_COLUMNS = (
    ("count", "count"),
    ("mean_s", "mean"),
    ("median_s", "median"),
    ("std_s", "std"),
    ("min_s", "min"),
    ("max_s", "max"),
    ("total_s", "total"),
    ("percent", "% of run"),
)


def _f32(a: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.ascontiguousarray(a, dtype=np.float32)


def _ms(seconds: object) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "–"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def span_color(name: str) -> str:
    return PHASE_COLORS.get(name) or SPAN_COLORS[sum(name.encode()) % len(SPAN_COLORS)]


def summary_html(rows: tuple[dict[str, object], ...]) -> str:
    """The telemetry summary as an HTML table (times in ms or s)."""
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in _COLUMNS)
    body = []
    for row in rows:
        cells = []
        for key, _ in _COLUMNS:
            value = row.get(key)
            if key == "count":
                text = str(value)
            elif key == "percent":
                ok = isinstance(value, (int, float)) and math.isfinite(value)
                text = f"{value:.1f} %" if ok else "–"
            else:
                text = _ms(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        name = html.escape(f"{row.get('name')} ({row.get('kind')})")
        body.append(f"<tr><th style='text-align:left'>{name}</th>{''.join(cells)}</tr>")
    return (
        "<table class='nbmonitor-timeline-summary' style='font-size:12px;border-spacing:8px 1px'>"
        f"<tr><th></th>{head}</tr>{''.join(body)}</table>"
    )


class Timeline:
    """The timeline panel of one dashboard."""

    def __init__(self, x_scale: bq.Scale) -> None:
        self._x_scale = x_scale
        self._y_scale = bq.LinearScale(min=0.0)
        # One mark per phase, each filled down to 0 and drawn from the top of the stack down,
        # so that each covers the ones above it except its own band.
        self._stack = {
            name: bq.Lines(
                x=np.zeros(0, np.float32),
                y=np.zeros(0, np.float32),
                scales={"x": x_scale, "y": self._y_scale},
                colors=[color],
                fill="bottom",
                fill_colors=[color],
                fill_opacities=[1.0],
                stroke_width=0.5,
                labels=[name],
                display_legend=True,
            )
            for name, color in reversed(PHASE_COLORS.items())
        }
        step_axis = bq.Axis(scale=x_scale, label="step", tick_format="~s", grid_lines="dashed")
        seconds_axis = bq.Axis(
            scale=self._y_scale, side="left", tick_format=".2~s", grid_lines="dashed"
        )
        self.phases = bq.Figure(
            title="Step phases (s per step)",
            marks=list(self._stack.values()),
            axes=[step_axis, seconds_axis],
            fig_margin=_MARGIN,
            legend_location="top-left",
            legend_text={"font-size": "11px"},
            title_style={"font-size": "13px"},
            animation_duration=0,
            layout=widgets.Layout(**_LAYOUT),
        )
        self._gx, self._gy = bq.LinearScale(), bq.LinearScale(reverse=True)
        self._bars = bq.Lines(
            x=np.zeros((0, 2), np.float32),
            y=np.zeros((0, 2), np.float32),
            scales={"x": self._gx, "y": self._gy},
            stroke_width=14,
        )
        self._names = bq.Label(
            x=[], y=[], text=[], scales={"x": self._gx, "y": self._gy}, font_weight="normal"
        )
        self._tracks = bq.Label(
            x=[], y=[], text=[], scales={"x": self._gx, "y": self._gy}, colors=["black"]
        )
        self.gantt = bq.Figure(
            title="Last steps: phases and spans",
            marks=[self._bars, self._names, self._tracks],
            axes=[bq.Axis(scale=self._gx, label="ms", tick_format=".3~g", grid_lines="dashed")],
            fig_margin=_MARGIN,
            title_style={"font-size": "13px"},
            animation_duration=0,
            layout=widgets.Layout(**_LAYOUT),
        )
        self.table = widgets.HTML("")
        self.box = widgets.VBox(
            [
                widgets.GridBox(
                    [self.phases, self.gantt],
                    layout=widgets.Layout(
                        grid_template_columns="repeat(auto-fill, minmax(380px, 1fr))",
                        grid_gap="0px 8px",
                        width="100%",
                    ),
                ),
                self.table,
            ],
            layout=widgets.Layout(display="none", width="100%"),
        )
        self._sent: tuple[Any, ...] = ()

    def widgets(self) -> Iterator[widgets.Widget]:
        yield self.box
        yield self.table
        yield self.phases
        yield self.gantt
        yield self._bars
        yield self._names
        yield self._tracks
        yield from self._stack.values()

    def update(self, timeline: TimelineFrame | None) -> bool:
        """Show ``timeline``; False when there was nothing new to send."""
        if timeline is None:
            return False
        key = (
            timeline.phases,
            timeline.steps.tobytes(),
            timeline.seconds.tobytes(),
            timeline.gantt,
            summary_html(timeline.summary),
        )
        if key == self._sent:
            return False
        self._sent = key
        self._update_stack(timeline)
        self._update_gantt(timeline.gantt[-MAX_BARS:])
        self.table.value = key[-1]
        self.box.layout.display = None
        return True

    def _update_stack(self, timeline: TimelineFrame) -> None:
        x = _f32(timeline.steps)
        top = np.zeros(len(x))
        tops: dict[str, np.ndarray[Any, Any]] = {}
        for i, name in enumerate(timeline.phases):
            top = top + timeline.seconds[i]
            tops[name] = top
        for name, mark in self._stack.items():
            with mark.hold_sync():
                y = tops.get(name)
                if y is None:  # not measured: nothing drawn
                    mark.x, mark.y = np.zeros(0, np.float32), np.zeros(0, np.float32)
                else:
                    mark.x, mark.y = x, _f32(y)

    def _update_gantt(self, bars: tuple[GanttBar, ...]) -> None:
        tracks = list(dict.fromkeys(b.track for b in bars))
        row = {t: i for i, t in enumerate(tracks)}
        starts = np.array([b.start_s * 1e3 for b in bars])
        ends = np.array([(b.start_s + b.duration_s) * 1e3 for b in bars])
        ys = np.array([row[b.track] for b in bars], dtype=np.float64)
        with self._bars.hold_sync():
            self._bars.x = _f32(np.column_stack((starts, ends)) if bars else np.zeros((0, 2)))
            self._bars.y = _f32(np.column_stack((ys, ys)) if bars else np.zeros((0, 2)))
            self._bars.colors = [span_color(b.name) for b in bars] or ["#1f77b4"]
        span = float(ends.max() - starts.min()) if bars else 1.0
        # Names where the bar is wide enough to hold one; the track names at the left.
        wide = [i for i, b in enumerate(bars) if b.duration_s * 1e3 > span / 6]
        with self._names.hold_sync():
            self._names.x = [float(starts[i]) for i in wide]
            self._names.y = [float(ys[i]) + 0.35 for i in wide]
            self._names.text = [bars[i].name for i in wide]
            self._names.colors = [span_color(bars[i].name) for i in wide] or ["black"]
        with self._tracks.hold_sync():
            self._tracks.x = [float(starts.min()) if bars else 0.0] * len(tracks)
            self._tracks.y = [i - 0.3 for i in range(len(tracks))]
            self._tracks.text = tracks
        self._gy.min, self._gy.max = -0.7, max(len(tracks) - 0.4, 0.6)


__all__ = ["Timeline", "summary_html"]
