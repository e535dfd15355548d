"""The sampler side of a live run, built complete (part of the live entrance, ``monitor.py``):
the sinks as one ``Sink``, the training parts, the session (``_engine/session.py``: the
pipeline and the sampler thread that drives it) and the ``Lifetime`` that ends it; each
constructed with everything it needs, nothing assigned to it afterwards.

Nothing built here holds the Monitor or the model: the sampler thread would keep them alive
(lifetime.py says who owns what).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from nbmonitor._capture.capture import Capture
from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.frame import RunInfo
from nbmonitor._engine.pipeline import SINK_RETRY_S
from nbmonitor._engine.pipeline_parts import PipelineParts, Steer, Training
from nbmonitor._engine.session import Session
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.health import Health
from nbmonitor.health.view import RankColumns
from nbmonitor.live.lifetime import Lifetime, StepCount
from nbmonitor.sinks import FanOut, Sink


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
) -> Lifetime:
    """The sampler side of one run, its session not yet started. ``sinks`` get every tick's
    rows, the run log first."""
    # Weakly: the probe holds the parameters (and their copies), which go with the model.
    update_ref = weakref.ref(capture.update_ratio) if capture.update_ratio else None

    def copy_skipped() -> float | None:
        update = update_ref() if update_ref is not None else None
        return update.copy_max_bytes if update is not None and update.copy_skipped else None

    session = Session(
        PipelineParts(
            info=info,
            backend=backend,
            current_step=count.step,
            health=health,
            sinks=FanOut(sinks, errors, retry_after=SINK_RETRY_S),
            errors=errors,
            training=Training(
                drain=capture.recorder.drain,
                layers=layers,
                forward_checked=forward_checked,
                update_copy_skipped=copy_skipped,
                ranks=ranks,
                current_phase=count.phase if job else None,
                steer=steer,
            ),
            clock=clock,
            interval=interval,
        ),
        counts=count.counts,
        stop=count.remove_hooks,
    )
    return Lifetime(count, session)
