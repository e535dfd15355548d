"""The bqplot half of the dashboard: curves against the training step.

Every figure shares one x scale, so zooming or panning one moves all of them and a step-time
spike lines up with the GPU memory drop beneath it. bqplot resends a whole array on every
assignment, so only decimated series are assigned (the Frame's, ~2,000 points), as float32
(half the bytes; a chart cannot show more precision), and only when they changed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as widgets
import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Series
from nbmonitor.ui.console import clip_summary

# bqscales (bqplot's scales) passes trait metadata the pre-traitlets-4.1 way; the resulting
# DeprecationWarning at import is theirs, not the user's, and would fail warnings-as-errors test
# runs (ours and our users'). Silence exactly that message, only for the import.
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", r"metadata \{.*\} was set from the constructor", DeprecationWarning
    )
    import bqplot as bq

F32 = npt.NDArray[np.float32]
Transform = Callable[[npt.NDArray[np.float64], Mapping[str, float]], npt.NDArray[np.float64]]

GIB = float(2**30)
GRAD_TITLE = "Gradient norm"
_MARGIN = {"top": 36, "bottom": 32, "left": 56, "right": 16}
_LAYOUT = {"height": "220px", "width": "auto", "min_width": "300px"}
_BLUE, _LIGHT_BLUE, _ORANGE, _GREEN, _GREY, _PURPLE = (
    "#1f77b4",
    "#9ecae1",
    "#ff7f0e",
    "#2ca02c",
    "#7f7f7f",
    "#9467bd",
)


@dataclass
class _Line:
    """One bqplot Lines mark fed by one Frame series (optionally transformed, e.g. to GiB)."""

    key: str
    mark: bq.Lines
    transform: Transform | None = None
    sent: tuple[F32, F32] | None = None

    def update(self, series: Series, latest: Mapping[str, float]) -> bool:
        y = series.y if self.transform is None else self.transform(series.y, latest)
        n = min(len(series.x), len(y))  # a malformed series must not desync x and y
        x32 = np.ascontiguousarray(series.x[:n], dtype=np.float32)
        y32 = np.ascontiguousarray(y[:n], dtype=np.float32)
        if self.sent is not None and (
            np.array_equal(self.sent[0], x32) and np.array_equal(self.sent[1], y32, equal_nan=True)
        ):
            return False  # unchanged (e.g. system series while training is paused): send nothing
        self.mark.x = x32
        self.mark.y = y32
        self.sent = (x32, y32)
        return True

    def update_from(self, series: Mapping[str, Series], latest: Mapping[str, float]) -> bool:
        s = series.get(self.key)
        return s is not None and self.update(s, latest)


@dataclass
class _Band:
    """A band between two Frame series of one x (``fill="between"``), e.g. a min-max band."""

    low: str
    key: str  # the high series
    mark: bq.Lines
    sent: tuple[F32, F32] | None = None

    def update_from(self, series: Mapping[str, Series], latest: Mapping[str, float]) -> bool:
        lo, hi = series.get(self.low), series.get(self.key)
        if lo is None or hi is None:
            return False
        n = min(len(lo.x), len(lo.y), len(hi.y))
        x32 = np.ascontiguousarray(lo.x[:n], dtype=np.float32)
        y32 = np.ascontiguousarray(np.vstack((lo.y[:n], hi.y[:n])), dtype=np.float32)
        if self.sent is not None and (
            np.array_equal(self.sent[0], x32) and np.array_equal(self.sent[1], y32, equal_nan=True)
        ):
            return False
        self.mark.x = x32
        self.mark.y = y32
        self.sent = (x32, y32)
        return True


@dataclass
class _Figure:
    """A figure, its y scales by mode ("linear"/"log") and the lines drawn on it."""

    key: str
    figure: bq.Figure
    lines: list[_Line | _Band]
    y_scales: dict[str, bq.Scale]
    y_axis: bq.Axis
    panzoom: bq.interacts.PanZoom
    extra_scales: list[bq.Scale] = field(default_factory=list)
    shown: bool = False

    def widgets(self) -> Iterator[widgets.Widget]:
        yield self.figure
        yield self.figure.layout
        for line in self.lines:
            yield line.mark


def _mode_scale(mode: str) -> bq.Scale:
    return bq.LogScale() if mode == "log" else bq.LinearScale()


class Curves:
    """All line charts of one dashboard, laid out in a wrapping grid."""

    def __init__(self) -> None:
        self.x_scale = bq.LinearScale()
        self.figures: dict[str, _Figure] = {}
        self._gpus: set[int] = set()
        self._add_figure(
            "loss",
            "Loss",
            [("loss", "loss", _LIGHT_BLUE, None), ("loss_smooth", "smoothed", _BLUE, None)],
        )
        self._add_figure("lr", "Learning rate", [("lr", "lr", _GREEN, None)])
        self._add_figure(
            "grad_norm", GRAD_TITLE, [("grad_norm", "grad norm", _PURPLE, None)], mode="log"
        )
        self._add_step_time_figure()
        self._add_figure("throughput", "Samples/s", [("samples_per_s", "samples/s", _ORANGE, None)])
        self._add_figure("tokens", "Tokens/s", [("tokens_per_s", "tokens/s", _ORANGE, None)])
        self._add_figure(
            "cpu",
            "CPU %",
            [
                ("cpu_percent", "system", _BLUE, None),
                ("process_cpu_percent", "this process", _ORANGE, None),
            ],
        )
        self._add_figure(
            "ram",
            "RAM (GiB)",
            [
                ("ram_used_bytes", "used", _BLUE, _to_gib),
                ("process_rss_bytes", "this process", _ORANGE, _to_gib),
                ("ram_total_bytes", "total", _GREY, _to_gib),
            ],
        )
        self.grid = widgets.GridBox(
            children=[],
            layout=widgets.Layout(
                grid_template_columns="repeat(auto-fill, minmax(380px, 1fr))",
                grid_gap="0px 8px",
                width="100%",
            ),
        )

    # -- construction ---------------------------------------------------------------------------

    def _make(
        self,
        key: str,
        title: str,
        specs: list[tuple[str, str, str, Transform | None]],
        mode: str,
    ) -> tuple[list[_Line], bq.Scale, bq.Axis]:
        y_scale = _mode_scale(mode)
        lines = [
            _Line(
                series_key,
                bq.Lines(
                    x=np.zeros(0, np.float32),
                    y=np.zeros(0, np.float32),
                    scales={"x": self.x_scale, "y": y_scale},
                    colors=[color],
                    labels=[label],
                    stroke_width=1.5,
                    display_legend=len(specs) > 1,
                ),
                transform,
            )
            for series_key, label, color, transform in specs
        ]
        y_axis = bq.Axis(scale=y_scale, side="left", tick_format=".3~g", grid_lines="dashed")
        return lines, y_scale, y_axis

    def _x_axis(self) -> bq.Axis:
        return bq.Axis(
            scale=self.x_scale, side="bottom", label="step", tick_format="~s", grid_lines="dashed"
        )

    def _figure(self, title: str, marks: list[bq.Mark], axes: list[bq.Axis]) -> bq.Figure:
        return bq.Figure(
            title=title,
            marks=marks,
            axes=axes,
            fig_margin=_MARGIN,
            legend_location="top-right",
            legend_style={"fill-opacity": "0.6", "stroke-width": "0"},
            legend_text={"font-size": "11px"},
            title_style={"font-size": "13px"},
            animation_duration=0,
            layout=widgets.Layout(**_LAYOUT, display="none"),
        )

    def _add_figure(
        self,
        key: str,
        title: str,
        specs: list[tuple[str, str, str, Transform | None]],
        mode: str = "linear",
    ) -> None:
        lines, y_scale, y_axis = self._make(key, title, specs, mode)
        panzoom = bq.interacts.PanZoom(scales={"x": [self.x_scale], "y": [y_scale]})
        figure = self._figure(title, [ln.mark for ln in lines], [self._x_axis(), y_axis])
        figure.interaction = panzoom
        self.figures[key] = _Figure(key, figure, [*lines], {mode: y_scale}, y_axis, panzoom)

    def _add_step_time_figure(self) -> None:
        # Read as people read it: the rolling median, and the band its windows' extremes span,
        # so that the spikes of a noisy machine do not drown the line.
        lines, y_scale, y_axis = self._make(
            "step_time", "", [("step_time_median", "median (band: min-max)", _BLUE, None)], "linear"
        )
        band = _Band(
            "step_time_min",
            "step_time_max",
            bq.Lines(
                x=np.zeros(0, np.float32),
                y=np.zeros((2, 0), np.float32),
                scales={"x": self.x_scale, "y": y_scale},
                colors=[_LIGHT_BLUE, _LIGHT_BLUE],
                fill="between",
                fill_colors=[_LIGHT_BLUE],
                fill_opacities=[0.5],
                stroke_width=0.5,
                display_legend=False,
            ),
        )
        lines[0].mark.display_legend = True
        panzoom = bq.interacts.PanZoom(scales={"x": [self.x_scale], "y": [y_scale]})
        figure = self._figure("Step time (s)", [band.mark, lines[0].mark], [self._x_axis(), y_axis])
        figure.interaction = panzoom
        self.figures["step_time"] = _Figure(
            "step_time", figure, [band, *lines], {"linear": y_scale}, y_axis, panzoom
        )

    def _ensure_gpu(self, index: int) -> None:
        if index in self._gpus:
            return
        self._gpus.add(index)
        p = f"gpu{index}_"
        self._add_figure(
            f"gpu{index}",
            f"GPU {index}: util and memory %",
            [
                (p + "util_percent", "util %", _GREEN, None),
                (p + "mem_used_bytes", "memory %", _PURPLE, _percent_of(p + "mem_total_bytes")),
            ],
        )

    # -- updates --------------------------------------------------------------------------------

    def all_widgets(self) -> Iterator[widgets.Widget]:
        yield self.grid
        for fig in self.figures.values():
            yield from fig.widgets()

    def prepare(self, series: Mapping[str, Series], n_devices: int) -> None:
        """Create the GPU figures this frame needs (before hold_sync is entered on them)."""
        gpus = {i for i in range(n_devices)}
        for key in series:
            if key.startswith("gpu") and key.endswith("_util_percent"):
                digits = key[3 : -len("_util_percent")]
                if digits.isdigit():
                    gpus.add(int(digits))
        for index in sorted(gpus):
            self._ensure_gpu(index)

    def update(self, series: Mapping[str, Series], latest: Mapping[str, float]) -> int:
        """Assign changed series to their marks; returns how many marks changed."""
        changed = 0
        visible: list[widgets.Widget] = []
        for fig in self.figures.values():
            for line in fig.lines:
                if line.update_from(series, latest):
                    changed += 1
            # A chart appears once it has data: no empty "Learning rate" without an optimizer.
            if not fig.shown and any(ln.sent is not None and len(ln.sent[0]) for ln in fig.lines):
                fig.shown = True
                fig.figure.layout.display = None
            if fig.shown:
                visible.append(fig.figure)
        if list(self.grid.children) != visible:
            self.grid.children = visible
        clip = clip_summary(latest)
        # A trait set to its value sends nothing.
        self.figures["grad_norm"].figure.title = f"Gradient norm: {clip}" if clip else GRAD_TITLE
        return changed

    def set_mode(self, key: str, mode: str) -> None:
        """Switch one figure's y axis between "linear" and "log" (the zoom is reset with it)."""
        fig = self.figures[key]
        if mode not in fig.y_scales:
            fig.y_scales[mode] = _mode_scale(mode)
        scale = fig.y_scales[mode]
        for line in fig.lines:
            line.mark.scales = {"x": self.x_scale, "y": scale}
        fig.y_axis.scale = scale
        fig.panzoom.scales = {"x": [self.x_scale], "y": [scale, *fig.extra_scales]}

    def mode(self, key: str) -> str:
        fig = self.figures[key]
        return "log" if isinstance(fig.y_axis.scale, bq.LogScale) else "linear"

    def reset_zoom(self) -> None:
        """Back to autoscaling: PanZoom pins min/max on the scales it touched."""
        scales: list[Any] = [self.x_scale]
        for fig in self.figures.values():
            scales.extend(fig.y_scales.values())
            scales.extend(fig.extra_scales)
        for scale in scales:
            with scale.hold_sync():
                scale.min = None
                scale.max = None
            # The front end may hold a zoom that never synced back; force the reset through.
            scale.send_state(["min", "max"])


def _to_gib(y: npt.NDArray[np.float64], latest: Mapping[str, float]) -> npt.NDArray[np.float64]:
    return y / GIB


def _percent_of(total_key: str) -> Transform:
    def transform(
        y: npt.NDArray[np.float64], latest: Mapping[str, float]
    ) -> npt.NDArray[np.float64]:
        total = latest.get(total_key, float("nan"))
        if not np.isfinite(total) or total <= 0:
            return np.full_like(y, np.nan)
        return y * (100.0 / total)

    return transform
