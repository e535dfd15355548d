"""The sampler side of a live run, wired (part of the live entrance, ``monitor.py``): the sinks,
the pipeline that feeds them and the sampler thread that drives it.

Nothing built here holds the Monitor or the model: the sampler thread would keep them alive
(_lifetime.py says who owns what).
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
from nbmonitor._engine.pipeline_parts import PipelineParts
from nbmonitor._engine.sampler import SamplerThread
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Health, non_finite_gradients
from nbmonitor.health.view import RankColumns
from nbmonitor.live.lifetime import Lifetime, flush_tick
from nbmonitor.sinks import FanOut, RunLogSink


@dataclass
class SamplerParts:
    info: RunInfo
    backend: Backend
    capture: Capture
    life: Lifetime
    layers: LayerStats
    health: Health
    forward_checked: bool
    runlog: RunLogSink
    errors: ErrorLog
    ranks: Callable[[], RankColumns | None] | None
    clock: Callable[[], float]
    interval: float


def build_sampler(parts: SamplerParts) -> tuple[Pipeline, SamplerThread]:
    """The pipeline and its (not yet started) sampler thread; the Lifetime gets both."""
    capture, life, errors = parts.capture, parts.life, parts.errors
    # Weakly: the probe holds the parameters (and their copies), which go with the model.
    update_ref = weakref.ref(capture.update_ratio) if capture.update_ratio else None

    def copy_skipped() -> float | None:
        update = update_ref() if update_ref is not None else None
        return update.copy_max_bytes if update is not None and update.copy_skipped else None

    # The sinks every tick's rows go to: the run log first; exporters join here.
    sinks = life.sinks = FanOut([parts.runlog], errors, retry_after=SINK_RETRY_S)
    life.backend = parts.backend

    pipeline = Pipeline(
        PipelineParts(
            info=parts.info,
            backend=parts.backend,
            drain=capture.recorder.drain,
            current_step=life.step,
            layers=parts.layers,
            health=parts.health,
            non_finite_report=non_finite_gradients,
            forward_checked=parts.forward_checked,
            sinks=sinks,
            errors=errors,
            status=life.status,
            update_copy_skipped=copy_skipped,
            ranks=parts.ranks,
            clock=parts.clock,
            interval=parts.interval,
        )
    )
    life.pipeline = pipeline
    thread = life.thread = SamplerThread(
        functools.partial(pipeline.tick, paced=True),
        parts.interval,
        flush=functools.partial(flush_tick, pipeline),
    )
    return pipeline, thread
