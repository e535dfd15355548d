"""The snapshot a view renders (``Frame``) and the one builder of it (``FrameBuilder``).

Plain numbers and numpy arrays, no torch, no widgets. The sampler builds one Frame per publish;
views (the notebook dashboard, the console line) only read it, and a replayed or tailed run is
drawn by the same builder from stores filled from disk. Keeping this the single hand-off keeps
``ui/`` free of torch and the engine free of widget libraries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.derive.memory_table import MemoryTable as MemoryTable
from nbmonitor._engine.derive.memory_table import memory_table
from nbmonitor._engine.derive.progress import eta_seconds
from nbmonitor._engine.derive.ranks_frame import RanksFrame as RanksFrame
from nbmonitor._engine.derive.timeline import phase_stack, smoothed, step_time_band
from nbmonitor._engine.store import Store

# Alert and name_list live in nbmonitor.health; re-exported here, where views read them.
from nbmonitor.health.alert import Alert as Alert
from nbmonitor.health.wording import MAX_NAMED as MAX_NAMED
from nbmonitor.health.wording import name_list as name_list

if TYPE_CHECKING:  # the run model's parts import this module's dataclasses
    from nbmonitor._engine.run_model import RunModel

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Series:
    """One line of a chart, already decimated for display (a few thousand points at most).

    ``x`` is the training step (float64 so that bucket edges can be fractional), ``y`` the value;
    non-finite points are left out because a chart cannot draw them (the alerts report them).
    """

    x: FloatArray
    y: FloatArray

    @property
    def nbytes(self) -> int:
        return int(self.x.nbytes + self.y.nbytes)


@dataclass(frozen=True)
class LayerFrame:
    """Per-layer view: names, a layers x columns heatmap of log10 grad norm, and a table."""

    names: tuple[str, ...]
    steps: FloatArray  # x of each heatmap column
    log10_grad_norm: FloatArray  # shape (len(names), len(steps)); NaN where unknown
    table: tuple[dict[str, object], ...] = ()


@dataclass(frozen=True)
class GanttBar:
    """One bar of the timeline's gantt: a phase or a span of one of the last steps, on a track
    (``"phases"``, ``"spans"``, ``"spans depth 1"``, ...), ``start_s`` seconds after the first
    bar shown."""

    track: str
    name: str
    step: int
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class TimelineFrame:
    """Where the time goes: the phases' mean seconds per step over bins of steps (``phases`` x
    ``steps``, stackable: they sum to the step time), a gantt of the last steps, and one
    telemetry summary row per phase and span name (name, kind, count, mean_s, median_s, std_s,
    min_s, max_s, total_s, percent of the time the steps took)."""

    phases: tuple[str, ...] = ()
    steps: FloatArray = field(default_factory=lambda: np.zeros(0))
    seconds: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    gantt: tuple[GanttBar, ...] = ()
    summary: tuple[dict[str, object], ...] = ()


class TimelineSource(Protocol):
    """What keeps the spans and phases of a run (``_engine/assemble/spans.SpanLog``);
    ``version`` changes whenever what it shows may have."""

    version: int

    def gantt(self) -> tuple[GanttBar, ...]: ...

    def summary(self, open_s: float = 0.0) -> tuple[dict[str, object], ...]: ...


@dataclass(frozen=True)
class Frame:
    """Everything a view shows at one moment.

    ``latest`` holds the newest value of each per-step metric (``loss``, ``lr``, ``grad_norm``,
    ``step_time``, ``samples_per_s``, ...) and each system metric (``cpu_percent``,
    ``ram_used_bytes``, ``gpu0_util_percent``, ...); NaN means unavailable.
    ``series`` maps a chart line name (the metric key, plus ``loss_smooth``) to its decimated
    points; system series are drawn against the training step current when they were sampled.
    ``devices`` lists one dict per accelerator with its gauge values (empty on CPU).
    ``step_time_median``, ``step_time_min`` and ``step_time_max`` are the step time's rolling
    median and the band of its windows' extremes, ``samples_per_s_smooth`` and
    ``tokens_per_s_smooth`` the rates' rolling medians (``_engine/derive/timeline.py``); with
    ``detail``, ``latest`` holds their newest points too (the header shows what the charts draw).
    ``notes`` says why a figure is missing, by figure (``"mfu"``: no peak known).
    ``memory`` is the Memory tab's table (what holds memory per device), None before the
    first breakdown or without ``detail``; ``allocator`` the CUDA allocator's settings
    (``PYTORCH_CUDA_ALLOC_CONF=...`` or ``default settings``; empty off CUDA).
    """

    run: str
    backend: str
    status: str  # "running" | "degraded" | "closed"
    step: int
    total_steps: int | None
    elapsed_s: float
    eta_s: float
    latest: dict[str, float]
    series: dict[str, Series] = field(default_factory=dict)
    devices: tuple[dict[str, float | str], ...] = ()
    alerts: tuple[Alert, ...] = ()
    errors: tuple[str, ...] = ()
    layers: LayerFrame | None = None
    timeline: TimelineFrame | None = None
    notes: Mapping[str, str] = field(default_factory=dict)
    memory: MemoryTable | None = None
    allocator: str = ""
    # Is the fine-tune training: the adapters' verdict in one line ("" without adapters).
    adapters: str = ""


# Chart lines sent to views: bounded so that one publish stays small however long the run.
STEP_SERIES = (
    "loss",
    "loss_smooth",
    "lr",
    "grad_norm",
    "step_time",
    "samples_per_s",
    "tokens_per_s",
)
SYSTEM_SERIES = (
    "cpu_percent",
    "process_cpu_percent",
    "ram_used_bytes",
    "process_rss_bytes",
    # The memory panel's (CUDA only; a series is made only for a column the run has).
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "cuda_interval_peak_bytes",
    "cuda_inactive_split_bytes",
    "mps_driver_allocated_bytes",
)
DEVICE_SERIES = ("util_percent", "mem_used_bytes", "temperature_c", "power_w")
MAX_POINTS = 2000
ALERTS_SHOWN = 20
ERRORS_SHOWN = 5


@dataclass(frozen=True)
class RunInfo:
    """What a frame says about the run itself, fixed for its life."""

    run: str
    backend: str
    total_steps: int | None
    devices: int = 0  # accelerators whose series are drawn (gpu0_..., gpu1_...)
    allocator: str = ""  # derive.memory_table.allocator_text, on CUDA runs


@dataclass
class FrameState:
    """What a frame says that is not in the run model: the run's status and step, how long it
    has run, the rows still open (a live run's steps not yet complete), what failed, the
    accelerators' gauges and why a figure is missing."""

    status: str
    step: int
    elapsed_s: float
    open_rows: Sequence[Mapping[str, float]] = ()
    errors: Sequence[str] = ()
    devices: tuple[dict[str, float | str], ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)


def _nothing() -> None:
    pass


class FrameBuilder:
    """Builds the Frame a view shows from the run model (``run_model.RunModel``): the same for
    a live run (filled by the sampler), a replayed run and a tailed one (filled from disk)."""

    def __init__(self, info: RunInfo, model: RunModel) -> None:
        self.info = info
        self.model = model
        self._kept = _Kept()

    def build(
        self, state: FrameState, detail: bool = True, hand_over: Callable[[], None] = _nothing
    ) -> Frame:
        """Without ``detail`` the chart series and the per-layer panel are left out: a console
        line needs neither, and decimating every series is the costly part of a frame.
        ``hand_over`` is called between its parts (the sampler lets the training thread in)."""
        model = self.model
        kept = self._kept
        steps, system = model.steps, model.system
        # What each part is made from, as keys: the stores only grow, so their row counts
        # say whether they changed; the other inputs are replaced whole when they change.
        steps_now, system_now = (steps, len(steps)), (system, len(system))
        latest: dict[str, float] = {k: v for k, v in model.last_sample.items() if k != "step"}
        if len(steps):
            latest.update(steps.last_row())
        for row in state.open_rows:
            latest.update({k: v for k, v in row.items() if not math.isnan(v) or k not in latest})
        latest.update(kept.get("derived", (*steps_now, *system_now, model.memory), model.derived))
        series: dict[str, Series] = {}
        names: list[tuple[Store, str]] = []
        if detail:
            names += [(steps, name) for name in STEP_SERIES]
            names += [(system, name) for name in SYSTEM_SERIES]
            for i in range(self.info.devices):
                names += [(system, f"gpu{i}_{key}") for key in DEVICE_SERIES]
        for store, name in names:
            if name in store.columns:
                made = kept.made

                def line(store: Store = store, name: str = name) -> Series:
                    return Series(*store.series(name, MAX_POINTS))

                series[name] = kept.get(f"series {name}", (store, len(store)), line)
                if kept.made > made:
                    hand_over()
        timeline = layers = memory = None
        if detail:
            memory = kept.get(
                "memory",
                (model.memory, *system_now),
                lambda: memory_table(model.memory, system, model.device_index),
            )
            band = kept.get("band", steps_now, lambda: _smoothed_lines(steps))
            series.update(band)
            # The header shows the statistic the charts draw: their newest smoothed points.
            for key in SMOOTHED:
                newest = band.get(key)
                if newest is not None and newest.y.size:
                    latest[key] = float(newest.y[-1])
            hand_over()
            open_s = sum(r.get("step_time", 0.0) for r in state.open_rows)
            open_s = open_s if math.isfinite(open_s) else 0.0
            spans = model.spans
            timeline = kept.get(
                "timeline",
                (*steps_now, spans, spans.version, open_s),
                lambda: _timeline(steps, spans, open_s),
            )
            hand_over()
            if model.layers is not None and model.layers.names:
                layers = model.layers.frame(model.layer_flags)
                hand_over()
        return Frame(
            run=self.info.run,
            backend=self.info.backend,
            status=state.status,
            step=state.step,
            total_steps=self.info.total_steps,
            elapsed_s=state.elapsed_s,
            eta_s=eta_seconds(steps, state.step, self.info.total_steps),
            latest=latest,
            series=series,
            devices=state.devices,
            alerts=model.alerts[-ALERTS_SHOWN:],
            errors=tuple(state.errors[-ERRORS_SHOWN:]),
            layers=layers,
            timeline=timeline,
            notes=dict(state.notes),
            memory=memory,
            allocator=self.info.allocator,
            adapters=model.adapter_verdict.text if model.adapter_verdict is not None else "",
        )


# The smoothed lines (the charts' and the header's): the step time's rolling median, and the
# rates' (rows of a rate scatter with the steps' own noise).
SMOOTHED = ("step_time_median", "samples_per_s_smooth", "tokens_per_s_smooth")


def _smoothed_lines(steps: Store) -> dict[str, Series]:
    lines = {k: Series(*xy) for k, xy in step_time_band(steps).items()}
    for key in ("samples_per_s", "tokens_per_s"):
        found = smoothed(steps, key)
        if found is not None:
            lines[f"{key}_smooth"] = Series(*found)
    return lines


T = TypeVar("T")


class _Kept:
    """The parts of the last frame, each made again only when what it is made from changed
    (``key``: objects compared by identity, numbers by value). A dashboard frame is built
    every second or two; on a loop slower than the sampler, or paused between cells, most of
    its parts are as they were. ``made`` counts the parts made (a test counts them)."""

    def __init__(self) -> None:
        self._parts: dict[str, tuple[tuple[object, ...], object]] = {}
        self.made = 0

    def get(self, part: str, key: tuple[object, ...], make: Callable[[], T]) -> T:
        kept = self._parts.get(part)
        if kept is not None and _same(kept[0], key):
            return cast(T, kept[1])
        value = make()
        self.made += 1
        self._parts[part] = (key, value)
        return value


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return len(a) == len(b) and all(
        x is y or (isinstance(x, (int, float)) and type(x) is type(y) and x == y)
        for x, y in zip(a, b, strict=True)
    )


def _timeline(steps: Store, spans: TimelineSource | None, open_s: float) -> TimelineFrame | None:
    stack = phase_stack(steps)
    gantt = spans.gantt() if spans is not None else ()
    summary = spans.summary(open_s) if spans is not None else ()
    if stack is None and not summary:
        return None
    names, x, seconds = stack if stack is not None else ((), np.zeros(0), np.zeros((0, 0)))
    return TimelineFrame(names, x, seconds, gantt, summary)


class View(Protocol):
    """Something that shows Frames: the notebook dashboard, the console line, a user's own.

    Called from one thread at a time: the sampler's view worker (a replay calls it from the
    caller's thread); never
    raises on purpose. ``publish`` shows the newest frame; ``close`` shows the final one
    (status "closed") and releases the view's feed. Neither may call ``display()`` or
    ``print()``. ``wants_detail = False`` asks for frames without chart series or the
    per-layer panel (cheaper to build), for a view that shows neither.
    """

    wants_detail: bool

    def publish(self, frame: Frame) -> None: ...

    def close(self, frame: Frame) -> None: ...
