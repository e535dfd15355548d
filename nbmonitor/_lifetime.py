"""How a live monitor ends: by ``close()``, or by itself once its model is gone.

Ownership (what keeps what alive) is the point of this module. The model owns its monitor's
training-thread side (its hooks hold the step clock, which holds the probes and the model) and,
through ``_registry.LIVE``, the Monitor; the Monitor holds the step clock only weakly. The
sampler thread holds the pipeline, the sinks and this ``Lifetime``, none of which holds the
model or the Monitor. So a model the user drops (re-running a cell that builds a new one) is
collected with everything it owns, and the run is then closed from a short-lived thread: by
the model's weakref callback while the Monitor is still referenced, or by the Monitor's
finaliser when it goes too. Releasing never runs on the thread that collected the garbage: it
can be the sampler itself, which cannot join itself.
"""

from __future__ import annotations

import datetime as _dt
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nbmonitor._capture.clock import StepClock
from nbmonitor._engine.pipeline import Pipeline
from nbmonitor._engine.sampler import SamplerThread
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.sinks import FanOut


class Lifetime:
    """The parts a run's ending needs, none of them the model or the Monitor."""

    def __init__(self, clock: StepClock, errors: ErrorLog, wall_clock: Callable[[], float]) -> None:
        self._clock_ref: weakref.ref[StepClock] = weakref.ref(clock)
        # The clock's context (the step counter, the recorder; no model) outlives the clock,
        # so that the steps counted after the last look are still known once it is gone.
        self._ctx = clock.ctx
        self._last_step = clock.step
        self._last_ctx_step = clock.ctx.step
        self.errors = errors
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self.closed = False
        self._done = threading.Event()
        # Set by the composition root once built.
        self.pipeline: Pipeline | None = None
        self.thread: SamplerThread | None = None
        self.sinks: FanOut | None = None
        self.backend: Backend | None = None

    def step(self) -> int:
        """Steps so far: the step clock's while it lives, then the last it counted."""
        clock = self._clock_ref()
        if clock is not None:
            self._last_step, self._last_ctx_step = clock.step, self._ctx.step
            return self._last_step
        return self._last_step + self._ctx.step - self._last_ctx_step

    def clock(self) -> StepClock | None:
        return self._clock_ref()

    def status(self) -> str:
        if self.closed:
            return "closed"
        return "degraded" if len(self.errors) else "running"

    def release_soon(self, *_: Any) -> None:
        """Close from a thread of its own (a weakref callback or a finaliser: any thread)."""
        if self.closed or sys.is_finalizing():
            return
        thread = threading.Thread(target=self.close, name="nbmonitor-release", daemon=True)
        thread.start()

    def close(self, wait: float = 5.0) -> None:
        """Remove the hooks, stop the sampler, take and write the last records, close the
        views, sinks and backend. Idempotent, never raises; waits at most ``wait`` seconds on
        a tick stuck in a source."""
        with self._lock:
            closing = self.closed
            self.closed = True
        if closing:  # another thread is closing (the model went): done once it has
            self._done.wait(2 * wait)
            return
        final: dict[str, object] | None = None
        try:
            clock = self._clock_ref()
            if clock is not None:
                clock.remove()
            if self.thread is not None:
                self.thread.stop(wait)
            if self.pipeline is not None:
                final = self._final_tick(self.pipeline, wait)
        except Exception as exc:
            self.errors.add("close", exc)
        finally:
            try:
                self._release(final)
            finally:
                self._done.set()

    def _final_tick(self, pipeline: Pipeline, wait: float) -> dict[str, object]:
        if not pipeline.lock.acquire(timeout=wait):
            raise TimeoutError(
                "the sampler is stuck in a source; the last interval was not written"
            )
        try:
            pipeline.final_tick()
            pipeline.refresh_layers()
            frame = pipeline.frame()
            for view in pipeline.views:
                try:
                    view.close(frame)
                except Exception as exc:
                    self.errors.add("view", exc)
            return self.final_meta("degraded" if len(self.errors) else "closed")
        finally:
            pipeline.lock.release()

    def final_meta(self, status: str) -> dict[str, object]:
        return {
            "end_time": _dt.datetime.fromtimestamp(self._wall_clock(), _dt.UTC).isoformat(),
            "steps": self.step(),
            "status": status,
            "errors": [str(e) for e in self.errors.entries()],
        }

    def _release(self, final: dict[str, object] | None) -> None:
        # After the final tick; a close that gave up on a hung tick still closes the files,
        # with status "degraded" and what failed.
        if self.sinks is not None:
            self.sinks.close(final or self.final_meta("degraded"))
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:
                self.errors.add("close", exc)


def flush_tick(pipeline: Pipeline) -> None:
    """A full tick that takes every record now (flush, and the sampler serving a flush)."""
    # np.errstate: as in Pipeline.tick, no numpy warning reaches the user's output.
    with pipeline.lock, np.errstate(all="ignore"):
        pipeline.collect(wait=True)
        pipeline.tick(paced=False)
        pipeline.refresh_layers()


def current_cell() -> tuple[str, int] | None:
    """The notebook cell running now and its execution count, or None outside IPython. The
    cell is the front end's cell id (JupyterLab, Notebook 7 and VS Code send one with each
    execution), else the cell's text."""
    ipython = sys.modules.get("IPython")
    if ipython is None:  # not imported: not in IPython
        return None
    try:
        shell = ipython.get_ipython()
    except Exception:
        return None
    if shell is None:
        return None
    count = getattr(shell, "execution_count", 0)
    count = count if isinstance(count, int) else 0
    kernel = getattr(shell, "kernel", None)
    try:
        parent = kernel.get_parent() if kernel is not None else None
    except Exception:
        parent = None
    if isinstance(parent, dict):
        metadata = parent.get("metadata")
        cell_id = metadata.get("cellId") if isinstance(metadata, dict) else None
        if isinstance(cell_id, str) and cell_id:
            return f"id:{cell_id}", count
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", None)
    if history:
        return f"text:{history[-1]}", count
    return None
