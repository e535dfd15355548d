"""The sampler thread: one ``tick()`` every ``interval`` seconds does all of nbmonitor's work.

It is the only writer of the stores and the run log and the only caller of ``view.publish()``.
Each part of a tick is a *source*; a source that raises is counted in the ErrorLog and, after
repeated failures in a row, switched off, so one broken part never stops the others.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

MAX_FAILURES_IN_A_ROW = 5
# A paced source's cost per run is the median of its last this many runs.
PACE_RUNS = 5


@dataclass(frozen=True)
class ErrorEntry:
    time: float
    source: str
    message: str

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time))
        return f"{stamp} {self.source}: {self.message}"


class ErrorLog:
    """What failed, when, and how often; shared by hooks (training thread) and the sampler."""

    def __init__(self, keep: int = 50) -> None:
        self._lock = threading.Lock()
        self._entries: list[ErrorEntry] = []
        self._keep = keep
        self.counts: dict[str, int] = {}
        self.disabled: set[str] = set()

    def add(self, source: str, exc: BaseException) -> None:
        frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" ({frame[0].filename.rsplit('/', 1)[-1]}:{frame[0].lineno})" if frame else ""
        entry = ErrorEntry(time.time(), source, f"{type(exc).__name__}: {exc}{where}")
        with self._lock:
            self.counts[source] = self.counts.get(source, 0) + 1
            self._entries.append(entry)
            del self._entries[: -self._keep]

    def entries(self) -> list[ErrorEntry]:
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return sum(self.counts.values())


class Source:
    """One guarded part of a tick.

    A source with a ``share`` is paced: on scheduled ticks it runs only once the time since its
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
    ) -> None:
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.name = name
        self._fn = fn
        self._errors = errors
        self._in_a_row = 0
        self._share = share
        self._max_gap = max_gap
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._next_run = -float("inf")
        self._costs: collections.deque[float] = collections.deque(maxlen=PACE_RUNS)

    def __call__(self, paced: bool = False) -> None:
        if self.name in self._errors.disabled:
            return
        start = self._clock()
        if paced and self._share is not None and start < self._next_run:
            return
        cpu = self._cpu_clock()
        try:
            self._fn()
            self._in_a_row = 0
        except Exception as exc:
            self._in_a_row += 1
            self._errors.add(self.name, exc)
            if self._in_a_row >= MAX_FAILURES_IN_A_ROW:
                self._errors.disabled.add(self.name)
        finally:
            if self._share is not None:
                self._costs.append(self._cpu_clock() - cpu)
                gap = statistics.median(self._costs) / self._share
                self._next_run = start + min(gap, self._max_gap)


class SamplerThread:
    """Calls ``tick`` on a drift-corrected schedule in a daemon thread until stopped.

    The schedule is anchored at start: tick n is due at start + n * interval, so time spent in
    tick does not accumulate as drift; ticks missed while the process was busy are skipped,
    not bunched.
    """

    def __init__(
        self,
        tick: Callable[[], None],
        interval: float,
        name: str = "nbmonitor-sampler",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tick = tick
        self._interval = interval
        self._clock = clock
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._name = name

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def signal(self) -> None:
        """Ask the thread to stop without waiting (safe from atexit and from the thread itself)."""
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        next_due = self._clock() + self._interval
        while not self._stop.wait(max(0.0, next_due - self._clock())):
            # tick() guards each of its parts; this guard only keeps the thread alive.
            with contextlib.suppress(Exception):
                self._tick()
            next_due += self._interval
            now = self._clock()
            if next_due <= now:
                next_due = now + self._interval - ((now - next_due) % self._interval)
