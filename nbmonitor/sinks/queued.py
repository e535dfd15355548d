"""An exporter behind its own bounded queue and worker thread: a tool that stops answering (a
tracking server whose call never returns) holds up only itself.

The live run's exporters are fed on the run log's worker (``_engine/isolated.py``); a call into
a tool that hangs there would hold up the run log and every other sink, and the status would
blame the file system. So each exporter's sink is wrapped in a :class:`Queued`: ``write`` only
puts the tick's rows in the queue and returns; the exporter's own daemon thread
(``nbmonitor-export-<name>``) writes and flushes them, behind the sink's Guard (``sink:<name>``).

* **Bounded memory.** At most ``max_rows`` rows wait; past that the oldest waiting ticks are
  dropped, counted in ``dropped`` and said once per spell in the error log.
* **Named when it hangs.** A call that has not returned for ``hung_after`` seconds makes the
  exporter *hung*: ``hung_for()`` (the status line: "degraded: MLflow export hung for 12 s"),
  and one line in the error log.
* **Bounded close.** ``close`` hands the last rows and the close to the worker and waits at
  most ``close_wait`` seconds from when closing began (``begin_close``: a FanOut starts every
  exporter's close at once, so that several that hang cost the wait once), and not at all for
  one that already hung when closing began. A worker still in a call then finishes on its own
  (a daemon thread: it never holds the interpreter's exit).
* ``settle(timeout)``: wait until what was queued is written (``mon.flush()``), not past the
  moment the exporter counts as hung.

No torch; any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from nbmonitor.errors import ErrorLog, Guard
from nbmonitor.sinks.base import Batch, Sink

# Rows (all streams together) that may wait for one exporter; a tick of a busy run is a few
# hundred, so this is minutes of a stalled tool.
MAX_WAITING_ROWS = 50_000
# A call into the tool running this long counts as hung (as the run log's worker does).
HUNG_AFTER_S = 2.0
# How long close waits for an exporter's last rows and its close (Parquet's tables are written
# then), from when closing began: within the monitor's own close bound (5 s).
CLOSE_WAIT_S = 4.0


def _rows(batch: Batch) -> int:
    return sum(len(rows) for rows in batch.streams.values())


class Queued:
    """``sink`` fed from a bounded queue by a worker thread of its own (see the module)."""

    def __init__(
        self,
        sink: Sink,
        errors: ErrorLog,
        *,
        what: str | None = None,
        max_rows: int = MAX_WAITING_ROWS,
        hung_after: float = HUNG_AFTER_S,
        close_wait: float = CLOSE_WAIT_S,
        retry_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.name = sink.name
        self.what = what or f"{sink.name} export"
        self.max_rows = max_rows
        self.hung_after = hung_after
        self.close_wait = close_wait
        self.dropped = 0  # rows dropped because the queue was full
        self._errors = errors
        self._clock = clock
        self._guard = Guard(f"sink:{sink.name}", errors, retry_after=retry_after, clock=clock)
        self._cond = threading.Condition()
        self._waiting: deque[Batch] = deque()
        self._waiting_rows = 0
        self._flush = False  # a flush asked for since the last one
        self._since: float | None = None  # when the call in progress began
        self._hang_reported = False
        self._drop_reported = False
        self._final: Mapping[str, object] | None = None  # close asked for, with this meta
        self._close_began = 0.0
        self._close_said = False  # what close found is in the error log
        self._close_by: float | None = None
        self._done = False  # the sink is closed; the worker has ended
        self._thread: threading.Thread | None = None

    # -- the sampler's side (the run log's worker) ------------------------------------------

    def write(self, batch: Batch) -> None:
        if not batch:
            return
        with self._cond:
            if self._final is not None:
                return
            self._note_hang()
            self._waiting.append(batch)
            self._waiting_rows += _rows(batch)
            while self._waiting_rows > self.max_rows and len(self._waiting) > 1:
                old = _rows(self._waiting.popleft())
                self._waiting_rows -= old
                self.dropped += old
                if not self._drop_reported:
                    self._drop_reported = True
                    self._errors.add(
                        f"sink:{self.name}",
                        OverflowError(
                            f"rows dropped: {self.what} is behind and at most {self.max_rows} "
                            "rows wait for it (the run log has them all)"
                        ),
                    )
            self._start()
            self._cond.notify_all()

    def flush(self) -> None:
        with self._cond:
            if self._final is not None:
                return
            self._note_hang()
            self._flush = True
            self._start()
            self._cond.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until every queued row is written and flushed, at most ``timeout`` seconds and
        not past the moment a call in progress counts as hung; True when it is."""
        deadline = self._clock() + timeout
        with self._cond:
            while not self._idle():
                now = self._clock()
                if now >= deadline or self._hung(now):
                    return False
                left = deadline - now
                if self._since is not None:
                    left = min(left, self._since + self.hung_after - now)
                self._cond.wait(max(0.0, min(left, 0.05)))
            return True

    def hung_for(self) -> float | None:
        """Seconds the call in progress has run, once past ``hung_after``; else None."""
        with self._cond:
            since = self._since
        if since is None:
            return None
        elapsed = self._clock() - since
        return elapsed if elapsed >= self.hung_after else None

    def begin_close(self, final_meta: Mapping[str, object]) -> None:
        """Hand the close to the worker (after the rows still waiting); returns at once."""
        with self._cond:
            if self._final is not None:
                return
            self._final = dict(final_meta)
            self._close_began = self._clock()
            self._close_by = self._close_began + self.close_wait
            self._start()
            self._cond.notify_all()

    def close(self, final_meta: Mapping[str, object]) -> None:
        """Close the sink on its worker; wait at most ``close_wait`` seconds from when closing
        began, and not at all for a call that already hung then. Never raises."""
        self.begin_close(final_meta)
        with self._cond:
            while not self._done:
                assert self._close_by is not None
                now = self._clock()
                left = self._close_by - now
                if left <= 0 or self._hung_before_close(now):
                    break
                self._cond.wait(min(left, 0.05))
            if self._close_said:
                return
            self._close_said = True
            done, waiting, dropped = self._done, self._waiting_rows, self.dropped
        source = f"sink:{self.name}"
        if dropped:
            self._errors.add(
                source, OverflowError(f"{self.what}: {dropped} rows dropped in all (queue full)")
            )
        if not done:
            self._errors.add(
                source,
                TimeoutError(
                    f"{self.what} did not close: it hangs ({waiting} rows waiting); its last "
                    "rows and its close go on in the background"
                ),
            )

    # -- the worker ---------------------------------------------------------------------------

    def _idle(self) -> bool:  # under the lock
        return not self._waiting and not self._flush and self._since is None

    def _hung(self, now: float) -> bool:  # under the lock
        return self._since is not None and now - self._since >= self.hung_after

    def _hung_before_close(self, now: float) -> bool:  # under the lock
        # A call that already hung when closing began is not waited for; the closing work
        # itself (the last rows, Parquet's tables) is, up to close_wait.
        return self._hung(now) and self._since is not None and self._since < self._close_began

    def _note_hang(self) -> None:
        # Under the lock. Once per hang: the status line says it for as long as it lasts.
        if self._hang_reported or self._since is None:
            return
        elapsed = self._clock() - self._since
        if elapsed < self.hung_after:
            return
        self._hang_reported = True
        self._errors.add(
            f"sink:{self.name}",
            TimeoutError(
                f"{self.what} has not returned for {elapsed:.1f} s; its rows wait (at most "
                f"{self.max_rows}) and the run goes on without it"
            ),
        )

    def _start(self) -> None:
        # Under the lock.
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"nbmonitor-export-{self.name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: bool(self._waiting) or self._flush or self._final is not None
                )
                batches = list(self._waiting)
                self._waiting.clear()
                self._waiting_rows = 0
                self._drop_reported = False
                flush = self._flush or bool(batches)
                self._flush = False
                final = self._final
                self._since = self._clock()
            try:
                for batch in batches:
                    self._guard.run(lambda batch=batch: self.sink.write(batch))  # type: ignore[misc]
                if flush:
                    self._guard.run(self.sink.flush)
                if final is not None and not self._more():
                    try:
                        self.sink.close(final)
                    except Exception as exc:  # a sink's close should not raise
                        self._errors.add(f"sink:{self.name}", exc)
                    with self._cond:
                        self._since = None
                        self._done = True
                        self._cond.notify_all()
                    return
            finally:
                with self._cond:
                    if not self._done:
                        self._since = None
                        self._hang_reported = False
                    self._cond.notify_all()

    def _more(self) -> bool:
        with self._cond:
            return bool(self._waiting)


__all__ = ["CLOSE_WAIT_S", "HUNG_AFTER_S", "MAX_WAITING_ROWS", "Queued"]
