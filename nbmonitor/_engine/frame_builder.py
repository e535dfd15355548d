"""The one builder of the Frame a view shows (``FrameBuilder``), and what it keeps between
frames. It reads only the run model: live = replay = tail."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import numpy as np

from nbmonitor._engine.derive.memory_table import memory_table
from nbmonitor._engine.derive.progress import eta_seconds
from nbmonitor._engine.derive.timeline import phase_stack, smoothed, step_time_band
from nbmonitor._engine.frame import (
    ALERTS_SHOWN,
    DEVICE_SERIES,
    ERRORS_SHOWN,
    MAX_POINTS,
    STEP_SERIES,
    SYSTEM_SERIES,
    Frame,
    FrameState,
    RunInfo,
    Series,
    TimelineFrame,
    TimelineSource,
)
from nbmonitor._engine.store import Store

if TYPE_CHECKING:
    from nbmonitor._engine.run_model import RunModel


def _nothing() -> None:
    pass


class FrameBuilder:
    """Builds the Frame a view shows from the run model (``run_model.RunModel``): the same for
    a live run (filled by the sampler), a replayed run and a tailed one (filled from disk)."""

    def __init__(self, info: RunInfo, model: RunModel) -> None:
        self.info = info
        self.model = model
        self._kept = _Kept()

    @property
    def parts_made(self) -> int:
        """How many parts of frames this builder has made so far (a part whose inputs did not
        change since the last frame is kept, not made again)."""
        return self._kept.made

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
                lambda: _timeline(steps, spans, open_s, self.info.phases_device_every),
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


def _timeline(
    steps: Store, spans: TimelineSource | None, open_s: float, device_every: int = 0
) -> TimelineFrame | None:
    stack = phase_stack(steps)
    gantt = spans.gantt() if spans is not None else ()
    summary = spans.summary(open_s) if spans is not None else ()
    if stack is None and not summary:
        return None
    names, x, seconds = stack if stack is not None else ((), np.zeros(0), np.zeros((0, 0)))
    return TimelineFrame(names, x, seconds, gantt, summary, device_every if stack else 0)
