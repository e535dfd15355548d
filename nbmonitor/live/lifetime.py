"""How a live monitor ends: by ``close()``, or by itself once its model is gone.

Ownership (what keeps what alive) is the point of this module. The model owns its monitor's
training-thread side (its hooks hold the step clock, which holds the probes and the model) and,
through ``registry.LIVE``, the Monitor; the Monitor holds the step clock only weakly. The
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
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nbmonitor._capture.clock import StepClock
from nbmonitor._engine.isolated import Hung
from nbmonitor._engine.pipeline import Pipeline
from nbmonitor._engine.sampler import SamplerThread
from nbmonitor.backends.base import Backend
from nbmonitor.errors import ErrorLog
from nbmonitor.sinks import FanOut


class StepCount:
    """The run's step count, its step clock (held weakly) and whether the run has closed:
    what the pipeline, the spans and the Monitor ask while the run lives. Built first, from
    the clock alone, so that everything built after it is complete when built."""

    def __init__(self, clock: StepClock) -> None:
        # The step clock while it lives, else None: a weak reference, so that asking
        # (Monitor.log, at every step) is one C call.
        self.clock: weakref.ref[StepClock] = weakref.ref(clock)
        # The clock's context (the step counter, the recorder; no model) outlives the clock,
        # so that the steps counted after the last look are still known once it is gone.
        self._ctx = clock.ctx
        self._last_step = clock.step
        self._last_ctx_step = clock.ctx.step
        self.start = clock.step  # the steps done before this run (attach's start_step)
        # The clock's hook handles (they hold no model): a global one (adopt.py) outlives it.
        self.handles = clock.handles
        self.closed = False

    def step(self) -> int:
        """Steps so far: the step clock's while it lives, then the last it counted."""
        clock = self.clock()
        if clock is not None:
            self._last_step, self._last_ctx_step = clock.step, self._ctx.step
            return self._last_step
        return self._last_step + self._ctx.step - self._last_ctx_step

    def phase(self) -> int | None:
        """The step phase the training thread is in now (``PhaseTimer.current``)."""
        clock = self.clock()
        return clock.phases.current() if clock is not None else None

    def is_closed(self) -> bool:
        return self.closed


class Lifetime:
    """The parts a run's ending needs, none of them the model or the Monitor; built complete
    by ``build.py`` once the pipeline, its sampler thread and its sinks exist."""

    def __init__(
        self,
        count: StepCount,
        errors: ErrorLog,
        wall_clock: Callable[[], float],
        *,
        pipeline: Pipeline,
        thread: SamplerThread,
        sinks: FanOut,
        backend: Backend,
    ) -> None:
        self.count = count
        self.errors = errors
        self._wall_clock = wall_clock
        self.pipeline = pipeline
        self.thread = thread
        self.sinks = sinks
        self.backend = backend
        self._lock = threading.Lock()
        self._closing = threading.Lock()
        # The parts of closing done so far ("hooks", "thread", "final", "sinks", ...), and the
        # final meta the final tick made: a close() interrupted goes on from there.
        self._closed_parts: set[str] = set()
        self._final: dict[str, object] | None = None
        # Called first when the run closes (a profile still running stops its profiler).
        self.on_close: list[Callable[[], None]] = []
        self.profile: Any = None  # the latest mon.profile() (live/profile.py)
        self.stopped = False  # a stop was asked for and applied: the run closes "stopped"

    @property
    def closed(self) -> bool:
        return self.count.closed

    def step(self) -> int:
        return self.count.step()

    def clock(self) -> StepClock | None:
        return self.count.clock()

    def status(self) -> str:
        return self.pipeline.status()

    def release_soon(self, *_: Any) -> None:
        """Close from a thread of its own (a weakref callback or a finaliser: any thread)."""
        if self.closed or sys.is_finalizing():
            return
        thread = threading.Thread(target=self.close, name="nbmonitor-release", daemon=True)
        thread.start()

    def close(self, wait: float = 5.0) -> None:
        """Remove the hooks, stop the sampler, take and write the last records, close the
        views, sinks and backend. Idempotent, never raises; returns within ``wait`` seconds
        whatever hangs (one deadline for all its waits).

        Called on one of the sampler's workers (a view's ``publish`` that closes the run: the
        sampler is then waiting for that very call), the closing is handed to a short-lived
        thread and this returns at once; the run closes as soon as the call returns.

        Interruptible: a KeyboardInterrupt while it waits leaves the parts not yet done for the
        next ``close()``, which goes on from there, so the run is still finalised.
        """
        with self._lock:
            self.count.closed = True
        if self.pipeline.sources.on_worker():
            thread = threading.Thread(
                target=self.close, args=(wait,), name="nbmonitor-release", daemon=True
            )
            thread.start()
            return
        deadline = time.monotonic() + wait

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        # One closer at a time; another thread closing (the model went) is waited for.
        if not self._closing.acquire(timeout=wait):
            return
        try:
            self._close_parts(left)
        finally:
            self._closing.release()

    def _close_parts(self, left: Callable[[], float]) -> None:
        done = self._closed_parts
        try:
            if "profile" not in done:
                done.add("profile")  # a profile still running stops its profiler, once
                for stop in tuple(self.on_close):
                    try:
                        stop()
                    except Exception as exc:
                        self.errors.add("close", exc)
            if "hooks" not in done:
                clock = self.count.clock()
                if clock is not None:
                    clock.remove()
                for handle in self.count.handles:
                    handle.remove()
                done.add("hooks")
            if "thread" not in done:
                self.thread.stop(left())
                done.add("thread")
            if "final" not in done:
                self._final = self._final_tick(self.pipeline, left)
                done.add("final")
        except Exception as exc:
            self.errors.add("close", exc)
            done.update(("hooks", "thread", "final"))  # what failed is reported, not retried
        # A KeyboardInterrupt above skips this: the files stay open for the next close().
        self._release(self._final, left)

    def _final_tick(self, pipeline: Pipeline, left: Callable[[], float]) -> dict[str, object]:
        if not pipeline.lock.acquire(timeout=left()):
            raise TimeoutError(
                "the sampler is stuck in a source; the last interval was not written"
            )
        try:
            pipeline.final_tick()
            pipeline.refresh_layers()
            frame = pipeline.frame()
            views, errors = pipeline.views, self.errors

            def close_views() -> None:
                for view in views:
                    try:
                        view.close(frame)
                    except Exception as exc:
                        errors.add("view", exc)

            pipeline.sources.view.call(close_views, timeout=left(), wait_if_busy=True)
            ended = "stopped" if self.stopped else "degraded" if len(self.errors) else "closed"
            return self.final_meta(ended)
        finally:
            pipeline.lock.release()

    def final_meta(self, status: str) -> dict[str, object]:
        return {
            "end_time": _dt.datetime.fromtimestamp(self._wall_clock(), _dt.UTC).isoformat(),
            # This run's steps: a resumed run (start_step) holds only those it took.
            "steps": self.step() - self.count.start,
            "last_step": self.step(),
            "status": status,
            "errors": [str(e) for e in self.errors.entries()],
        }

    def _release(self, final: dict[str, object] | None, left: Callable[[], float]) -> None:
        # After the final tick; a close that gave up on a hung tick still closes the files,
        # with status "degraded" and what failed. Sinks and backend are closed on their
        # workers, within what is left of close()'s wait; a backend whose sampling hangs is
        # closed once that call returns (its worker's deferred work), not waited for.
        sinks, backend, done = self.sinks, self.backend, self._closed_parts
        sources = self.pipeline.sources
        if "sinks" not in done:
            done.add("sinks")  # handed over: a close interrupted while it runs is not redone
            meta = final or self.final_meta("degraded")
            if sources.runlog.busy:
                self.errors.add(
                    "close",
                    TimeoutError(
                        "the run log is hung: its last rows and meta.json are written when "
                        "the file system answers"
                    ),
                )
                hung_meta = {**meta, "status": "degraded", "errors": self.final_meta("")["errors"]}
                sources.runlog.defer(lambda: sinks.close(hung_meta))
            elif isinstance(
                sources.runlog.call(
                    lambda: sinks.close(meta), timeout=max(left(), 0.5), wait_if_busy=True
                ),
                Hung,
            ):
                self.errors.add(
                    "close",
                    TimeoutError("the run log hung while closing; meta.json may not be final"),
                )
        if "backend" not in done:
            done.add("backend")
            try:
                if sources.sample.busy:
                    sources.sample.defer(backend.close)
                else:
                    sources.sample.call(backend.close, timeout=left(), wait_if_busy=True)
            except Exception as exc:
                self.errors.add("close", exc)
        sources.close(left())


def flush_tick(pipeline: Pipeline) -> None:
    """A full tick that takes every record now (flush, and the sampler serving a flush)."""
    # np.errstate: as in Pipeline.tick, no numpy warning reaches the user's output.
    with pipeline.lock, np.errstate(all="ignore"):
        # Every step that has ended, the last one too: values the loop logs for it later
        # are reported, not written (StepAssembler.take).
        pipeline.collect(wait=True, ended=True)
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
