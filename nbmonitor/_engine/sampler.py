"""The sampler thread: one ``tick()`` every ``interval`` seconds does all of nbmonitor's work.

It is the only writer of the stores, the sinks and the views. Each part of a tick is a
*stage* behind its own ``Guard``: a stage that raises is counted in the ErrorLog and, after
repeated failures in a row, switched off, so one broken part never stops the others.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import threading
import time
from collections.abc import Callable

from nbmonitor.errors import ErrorLog, Guard

# A paced stage's cost per run is the median of its last this many runs.
PACE_RUNS = 5


class Stage:
    """One guarded part of a tick.

    A stage with a ``share`` is paced: on scheduled ticks it runs only once the time since its
    last run is at least its CPU time per run divided by ``share`` (and at most ``max_gap``
    seconds), so that it takes about that fraction of one core however large the model or the
    run grows. CPU time, not wall time: waiting for the GIL is not a cost. The cost per run is
    the median of the last few, so that one slow run (the first frame, a garbage collection)
    does not stall the dashboard for seconds.
    """

    def __init__(
        self,
        name: str,
        fn: Callable[[], None],
        errors: ErrorLog,
        share: float | None = None,
        max_gap: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
        retry_after: float | None = None,
    ) -> None:
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.name = name
        self._fn = fn
        self.guard = Guard(name, errors, retry_after=retry_after, clock=clock)
        self._share = share
        self._max_gap = max_gap
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._next_run = -float("inf")
        self._costs: collections.deque[float] = collections.deque(maxlen=PACE_RUNS)

    def __call__(self, paced: bool = False) -> None:
        if not self.guard.ready():
            return
        start = self._clock()
        if paced and self._share is not None and start < self._next_run:
            return
        cpu = self._cpu_clock()
        try:
            self.guard.run(self._fn)
        finally:
            if self._share is not None:
                self._costs.append(self._cpu_clock() - cpu)
                gap = statistics.median(self._costs) / self._share
                self._next_run = start + min(gap, self._max_gap)


class SamplerThread:
    """Calls ``tick`` on a drift-corrected schedule in a daemon thread until stopped, and
    ``flush`` whenever another thread asks for one (``request``).

    The schedule is anchored at start: tick n is due at start + n * interval, so time spent in
    tick does not accumulate as drift; ticks missed while the process was busy are skipped,
    not bunched.
    """

    def __init__(
        self,
        tick: Callable[[], None],
        interval: float,
        flush: Callable[[], None] | None = None,
        name: str = "nbmonitor-sampler",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tick = tick
        self._flush = flush or tick
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._served = threading.Condition()
        self._requested = 0
        self._done = 0
        self._thread: threading.Thread | None = None
        self._name = name

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def signal(self) -> None:
        """Ask the thread to stop without waiting (safe from atexit and from the thread itself)."""
        self._stop.set()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop and join the thread for at most ``timeout``; False when it did not end."""
        self.signal()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def request(self, timeout: float) -> bool:
        """Have the thread run ``flush`` now; wait at most ``timeout`` for it to finish."""
        with self._served:
            self._requested += 1
            target = self._requested
        self._wake.set()
        with self._served:
            return (
                self._served.wait_for(
                    lambda: self._done >= target or not self.alive, timeout=timeout
                )
                and self._done >= target
            )

    def _run(self) -> None:
        next_due = self._clock() + self._interval
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_due - self._clock()))
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._served:
                wanted = self._requested
            if wanted > self._done:
                # flush() and tick() guard each of their parts; this only keeps the thread.
                with contextlib.suppress(Exception):
                    self._flush()
                with self._served:
                    self._done = wanted
                    self._served.notify_all()
                continue
            if self._clock() < next_due:
                continue
            with contextlib.suppress(Exception):
                self._tick()
            next_due += self._interval
            now = self._clock()
            if next_due <= now:
                next_due = now + self._interval - ((now - next_due) % self._interval)
        with self._served:
            self._served.notify_all()
