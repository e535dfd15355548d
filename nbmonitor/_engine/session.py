"""One session of the sampler: the pipeline, the sampler thread that drives it, its sinks, its
backend and its views, from start to a bounded close. Every entrance runs one (a live run,
``live/``; a watch of the machine, ``machine/``, which ``nbmonitor top`` runs too) and says only
what differs: the parts it hands the pipeline, what it does first when it closes (a live run
removes its hooks) and the counts its final meta.json holds.

The main thread calls ``status()``, ``errors``, ``flush()``, ``frame()``, ``add_view()`` and
``close()``; none of them waits on a hung source past its timeout. The session holds neither
the entrance's face (the Monitor, the DeviceWatch) nor the model: the sampler thread holds the
session, and would keep them alive.
"""

from __future__ import annotations

import datetime as _dt
import functools
import threading
import time
from collections.abc import Callable

import numpy as np

from nbmonitor._engine.frame import Frame, View
from nbmonitor._engine.isolated import Hung
from nbmonitor._engine.pipeline import Pipeline
from nbmonitor._engine.pipeline_parts import PipelineParts
from nbmonitor._engine.sampler import SamplerThread

# How long ``frame()`` waits for a tick in progress before it says the sampler is stuck.
FRAME_TIMEOUT_S = 5.0


def _nothing() -> None:
    pass


class Session:
    """A pipeline and its sampler thread, started by ``start()`` and ended by ``close()``.

    ``stop`` is the entrance's own first step of closing (it runs before the sampler stops;
    a live run removes its hooks there); ``counts`` what the final meta.json says was done
    (``steps``, ...). ``on_close`` takes more first steps while the session runs (a profile
    that stops its profiler); each runs once.
    """

    def __init__(
        self,
        parts: PipelineParts,
        *,
        counts: Callable[[], dict[str, object]],
        stop: Callable[[], None] = _nothing,
    ) -> None:
        self.error_log = parts.errors
        self.sinks = parts.sinks
        self.backend = parts.backend
        self._wall_clock = parts.clock
        self._counts = counts
        self._stop = stop
        self.closed = False
        # Stopped on request (steering): the run closes "stopped", not "closed".
        self.stopped = False
        self.pipeline = Pipeline(parts, self.status)
        self.thread = SamplerThread(
            functools.partial(self.pipeline.tick, paced=True), parts.interval, flush=self._flush
        )
        self.on_close: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._closing = threading.Lock()
        # The parts of closing done so far ("first", "stop", "thread", "final", "sinks", ...),
        # and the final meta the final tick made: a close() interrupted goes on from there.
        self._done: set[str] = set()
        self._final: dict[str, object] | None = None

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the sampler thread (once; a closed session stays closed)."""
        if not self.closed:
            self.thread.start()

    def status(self) -> str:
        """``running``; ``degraded`` once something failed, saying which source hangs and
        for how long while one does; ``closed``, or ``stopped`` (closed after a stop asked
        for: steering)."""
        if self.closed:
            return "stopped" if self.stopped else "closed"
        hung = {**self.pipeline.sources.hung(), **self.sinks.hung()}
        if hung:
            what = "; ".join(f"{source} hung for {s:.0f} s" for source, s in hung.items())
            return f"degraded: {what}"
        return "degraded" if len(self.error_log) else "running"

    @property
    def errors(self) -> list[str]:
        """What failed inside nbmonitor, oldest first."""
        return [str(e) for e in self.error_log.entries()]

    def flush(self, timeout: float) -> bool:
        """Have the sampler take, check and write everything recorded so far, now; at most
        ``timeout`` seconds. Whether it finished (True once closed: nothing is left)."""
        if self.closed:
            return True
        if self.thread.alive:
            return self.thread.request(timeout)
        # Not started, or stopping: nothing else ticks.
        pipeline = self.pipeline
        if not pipeline.lock.acquire(timeout=timeout):
            return False
        try:
            self._flush()
        finally:
            pipeline.lock.release()
        return True

    def _flush(self) -> None:
        """A full tick that takes every record now (flush, and the sampler serving one)."""
        pipeline = self.pipeline
        # np.errstate: as in Pipeline.tick, no numpy warning reaches the user's output.
        with pipeline.lock, np.errstate(all="ignore"):
            # Every step that has ended, the last one too: values the loop logs for it later
            # are reported, not written (StepAssembler.take).
            pipeline.collect(wait=True, ended=True)
            pipeline.tick(paced=False)
            pipeline.refresh_layers()

    def frame(self, detail: bool = True, timeout: float = FRAME_TIMEOUT_S) -> Frame:
        """The snapshot the views show now, built between two ticks: ``TimeoutError`` when a
        tick in progress holds the pipeline past ``timeout`` (a source is hung)."""
        pipeline = self.pipeline
        if not pipeline.lock.acquire(timeout=timeout):
            raise TimeoutError(
                "nbmonitor: the sampler is stuck in a source (see errors); no frame now."
            )
        try:
            return pipeline.frame(detail)
        finally:
            pipeline.lock.release()

    @property
    def views(self) -> tuple[View, ...]:
        return self.pipeline.views

    def add_view(self, view: View) -> None:
        """Publish the frames to ``view`` too; a session already closed closes it at once with
        the last frame."""
        pipeline = self.pipeline
        if view not in pipeline.views:
            pipeline.views = (*pipeline.views, view)
            if self.closed:
                view.close(self.frame())

    # -- closing ---------------------------------------------------------------------------

    def close(self, wait: float = 5.0) -> None:
        """Run the entrance's first steps, stop the sampler, take and write the last records,
        close the views, sinks and backend. Idempotent, never raises; returns within ``wait``
        seconds whatever hangs (one deadline for all its waits).

        Called on one of the sampler's workers (a view's ``publish`` that closes the run: the
        sampler is then waiting for that very call), the closing is handed to a short-lived
        thread and this returns at once; the session closes as soon as the call returns.

        Interruptible: a KeyboardInterrupt while it waits leaves the parts not yet done for the
        next ``close()``, which goes on from there, so the run is still finalised.
        """
        with self._lock:
            self.closed = True
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
        done = self._done
        if "first" not in done:
            done.add("first")  # each runs once, even when it is interrupted
            for first in tuple(self.on_close):
                try:
                    first()
                except Exception as exc:
                    self.error_log.add("close", exc)
        if "stop" not in done:
            try:
                self._stop()
            except Exception as exc:  # reported; the sampler still stops, the rows are written
                self.error_log.add("close", exc)
            done.add("stop")
        try:
            if "thread" not in done:
                self.thread.stop(left())
                done.add("thread")
            if "final" not in done:
                self._final = self._final_tick(left)
                done.add("final")
        except Exception as exc:
            self.error_log.add("close", exc)
            done.update(("thread", "final"))  # what failed is reported, not retried
        # A KeyboardInterrupt above skips this: the files stay open for the next close().
        self._release(self._final, left)

    def _final_tick(self, left: Callable[[], float]) -> dict[str, object]:
        pipeline = self.pipeline
        if not pipeline.lock.acquire(timeout=left()):
            raise TimeoutError(
                "the sampler is stuck in a source; the last interval was not written"
            )
        try:
            pipeline.final_tick()
            pipeline.refresh_layers()
            frame = pipeline.frame()
            views, errors = pipeline.views, self.error_log

            def close_views() -> None:
                for view in views:
                    try:
                        view.close(frame)
                    except Exception as exc:
                        errors.add("view", exc)

            pipeline.sources.view.call(close_views, timeout=left(), wait_if_busy=True)
            ended = "stopped" if self.stopped else "degraded" if len(self.error_log) else "closed"
            return self.final_meta(ended)
        finally:
            pipeline.lock.release()

    def final_meta(self, status: str) -> dict[str, object]:
        """What meta.json says at the end: when, the entrance's counts, how, and what failed."""
        return {
            "end_time": _dt.datetime.fromtimestamp(self._wall_clock(), _dt.UTC).isoformat(),
            **self._counts(),
            "status": status,
            "errors": self.errors,
        }

    def _release(self, final: dict[str, object] | None, left: Callable[[], float]) -> None:
        # After the final tick; a close that gave up on a hung tick still closes the files,
        # with status "degraded" and what failed. Sinks and backend are closed on their
        # workers, within what is left of close()'s wait; a backend whose sampling hangs is
        # closed once that call returns (its worker's deferred work), not waited for.
        sinks, backend, done = self.sinks, self.backend, self._done
        sources = self.pipeline.sources
        if "sinks" not in done:
            done.add("sinks")  # handed over: a close interrupted while it runs is not redone
            meta = final or self.final_meta("degraded")
            if sources.runlog.busy:
                self.error_log.add(
                    "close",
                    TimeoutError(
                        "the run log is hung: its last rows and meta.json are written when "
                        "the file system answers"
                    ),
                )
                hung_meta = {**meta, "status": "degraded", "errors": self.errors}
                sources.runlog.defer(lambda: sinks.close(hung_meta))
            elif isinstance(
                sources.runlog.call(
                    lambda: sinks.close(meta), timeout=max(left(), 0.5), wait_if_busy=True
                ),
                Hung,
            ):
                self.error_log.add(
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
                self.error_log.add("close", exc)
        sources.close(left())


__all__ = ["Session"]
