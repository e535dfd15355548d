"""The snapshot a view renders (``Frame``, and ``DevicesFrame`` for the machine view): the
hand-off types between the engine and ``ui/``.

Plain numbers and numpy arrays, no torch, no widgets. The sampler builds one Frame per publish
(``frame_builder.FrameBuilder``); views (the notebook dashboard, the console line) only read it,
and a replayed or tailed run is drawn by the same builder from stores filled from disk. Keeping
this the single hand-off keeps ``ui/`` free of torch and the engine free of widget libraries;
it imports no builder, no run model (``lint-imports`` checks it, transitively).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.derive.memory_table import MemoryTable as MemoryTable
from nbmonitor._engine.derive.ranks_frame import RanksFrame as RanksFrame

# Alert and name_list live in nbmonitor.health; re-exported here, where views read them.
from nbmonitor.health.alert import Alert as Alert
from nbmonitor.health.wording import MAX_NAMED as MAX_NAMED
from nbmonitor.health.wording import name_list as name_list

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
    # The phases of every this many steps (those divisible by it) were timed on the device
    # (CUDA events), the others on the host clock; 0: every step on the host clock.
    device_every: int = 0


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
    status: str  # "running" | "degraded" | "closed" | "stopped"
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
    # Phases timed on the device on every this many steps (meta.json "phases"); 0: none.
    phases_device_every: int = 0


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


class GpuProcess(NamedTuple):
    """A process using a GPU: its pid, its name (``"?"`` when the pid is not in this PID
    namespace, e.g. from a container) and the device memory NVML says it uses (NaN when not
    reported)."""

    pid: int
    name: str
    used_bytes: float


@dataclass(frozen=True)
class DevicesFrame:
    """One moment of the machine view.

    ``history`` holds the recent samples, oldest first, under their sample keys plus ``time``
    (seconds since the epoch): at most the last few minutes, so sparklines need no other
    store. ``thresholds`` are the device rules' (``temperature_c``, ``memory_fraction``,
    ``idle_util_percent``), for colouring values before an alert fires.
    """

    frame: Frame
    host: str
    interval: float
    processes: tuple[tuple[GpuProcess, ...], ...] = ()
    history: Mapping[str, FloatArray] = field(default_factory=dict)
    thresholds: Mapping[str, float] = field(default_factory=dict)
    run_dir: str | None = None
    notes: tuple[str, ...] = ()


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
