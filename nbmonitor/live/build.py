"""The sampler side of a live run, built complete (part of the live entrance, ``monitor.py``):
the sinks, the pipeline that holds them as its one ``Sink``, the sampler thread that drives
it, and the ``Lifetime`` that ends them; each constructed with everything it needs, nothing
assigned to it afterwards.

Nothing built here holds the Monitor or the model: the sampler thread would keep them alive
(lifetime.py says who owns what).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from nbmonitor._capture.capture import Capture
from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.frame import RunInfo
from nbmonitor._engine.pipeline import SINK_RETRY_S, Pipeline
from nbmonitor._engine.pipeline_parts import PipelineParts, Steer
from nbmonitor._engine.sampler import SamplerThread
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Health, non_finite_gradients
from nbmonitor.health.view import RankColumns
from nbmonitor.live.lifetime import Lifetime, StepCount, flush_tick
from nbmonitor.sinks import FanOut, Sink


@dataclass(frozen=True)
class SamplerSide:
    """What ``build_sampler`` built: the pipeline, its (not yet started) thread, and the
    Lifetime that ends both."""

    pipeline: Pipeline
    thread: SamplerThread
    life: Lifetime


def build_sampler(
    *,
    info: RunInfo,
    backend: Backend,
    capture: Capture,
    count: StepCount,
    layers: LayerStats,
    health: Health,
    forward_checked: bool,
    sinks: list[Sink],
    errors: ErrorLog,
    ranks: Callable[[], RankColumns | None] | None,
    job: bool,
    clock: Callable[[], float],
    interval: float,
    steer: Steer | None = None,
) -> SamplerSide:
    """The sampler side of one run. ``sinks`` get every tick's rows, the run log first."""
    # Weakly: the probe holds the parameters (and their copies), which go with the model.
    update_ref = weakref.ref(capture.update_ratio) if capture.update_ratio else None

    def copy_skipped() -> float | None:
        update = update_ref() if update_ref is not None else None
        return update.copy_max_bytes if update is not None and update.copy_skipped else None

    fan_out = FanOut(sinks, errors, retry_after=SINK_RETRY_S)
    pipeline = Pipeline(
        PipelineParts(
            info=info,
            backend=backend,
            drain=capture.recorder.drain,
            current_step=count.step,
            layers=layers,
            health=health,
            non_finite_report=non_finite_gradients,
            forward_checked=forward_checked,
            sinks=fan_out,
            errors=errors,
            closed=count.is_closed,
            update_copy_skipped=copy_skipped,
            ranks=ranks,
            current_phase=count.phase if job else None,
            clock=clock,
            interval=interval,
            steer=steer,
        )
    )
    thread = SamplerThread(
        functools.partial(pipeline.tick, paced=True),
        interval,
        flush=functools.partial(flush_tick, pipeline),
    )
    life = Lifetime(
        count, errors, clock, pipeline=pipeline, thread=thread, sinks=fan_out, backend=backend
    )
    return SamplerSide(pipeline, thread, life)
