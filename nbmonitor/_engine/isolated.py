"""Calls into sources that can hang, each source on a worker thread of its own.

A backend on a wedged GPU (NVML blocks), a sink on a network filesystem or a front end that
stops reading can block a call for minutes. Python cannot interrupt such a call, so the
sampler does not make it itself: it hands it to the source's worker and waits at most a
timeout. A call still running then is *hung*: the sampler goes on with the rest of its tick
without that source, later calls to it return ``HUNG`` at once (they are not queued), and
the status names it and says for how long. When the call returns at last, the source is
used again; an error it raised then is logged under the source's name.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar, cast

from nbmonitor.errors import ErrorLog

T = TypeVar("T")


class Hung:
    def __repr__(self) -> str:
        return "HUNG"


HUNG: Final = Hung()


class Isolated:
    """One source's calls, run on a daemon worker thread (``nbmonitor-<name>``) made on first use.

    ``what`` says what the source does, for the status line ("system sampling"). ``cpu_used``
    is the worker's CPU time in calls so far, so that a paced stage can count what it costs.
    """

    def __init__(
        self,
        name: str,
        what: str,
        errors: ErrorLog,
        timeout: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.what = what
        self.timeout = timeout
        self.cpu_used = 0.0
        self._errors = errors
        self._monotonic = monotonic
        self._cond = threading.Condition()
        self._job: Callable[[], object] | None = None
        self._since: float | None = None  # when the call in progress began
        self._outcome: tuple[bool, object] | None = None
        self._abandoned = False  # the caller stopped waiting for the call in progress
        self._reported = False  # this hang is in the error log
        self._stopping = False
        self._deferred: list[Callable[[], object]] = []
        self._thread: threading.Thread | None = None

    def call(
        self, fn: Callable[[], T], timeout: float | None = None, wait_if_busy: bool = False
    ) -> T | Hung:
        """``fn()`` on the worker: its value, its exception re-raised, or ``HUNG`` when it did
        not return within ``timeout`` (or an earlier call still runs, or the source is closed).
        With ``wait_if_busy`` an earlier call is first waited for, up to ``timeout`` too."""
        limit = self.timeout if timeout is None else timeout
        with self._cond:
            if wait_if_busy and self._since is not None:
                self._cond.wait_for(lambda: self._since is None or self._stopping, limit)
            if self._since is not None or self._stopping:
                self._report_hang()
                return HUNG
            self._start_worker()
            self._job, self._outcome, self._abandoned = fn, None, False
            self._since = self._monotonic()
            self._cond.notify_all()
            try:
                finished = self._cond.wait_for(lambda: self._outcome is not None, limit)
            except BaseException:  # a KeyboardInterrupt: the call goes on without a waiter
                self._abandoned = True
                raise
            if not finished:
                self._abandoned = True
                self._report_hang()
                return HUNG
            assert self._outcome is not None
            ok, value = self._outcome
            self._outcome = None
        if ok:
            return cast(T, value)
        assert isinstance(value, BaseException)
        raise value

    def submit(self, fn: Callable[[], object]) -> bool:
        """Start ``fn()`` on the worker and return at once, its errors going to the error log
        (work nobody waits for: a scheduled tick's rows). False, and nothing started, while
        an earlier call still runs or the source is closed."""
        with self._cond:
            if self._since is not None or self._stopping:
                return False
            self._start_worker()
            self._job, self._outcome, self._abandoned = fn, None, True
            self._since = self._monotonic()
            self._cond.notify_all()
            return True

    def wait_idle(self) -> bool:
        """Wait for the call in progress to return, but not past the moment it counts as hung
        (``timeout`` after it began); True when none is in progress then."""
        with self._cond:
            since = self._since
            if since is not None:
                left = since + self.timeout - self._monotonic()
                self._cond.wait_for(lambda: self._since is None or self._stopping, max(0.0, left))
            return self._since is None

    def note_hang(self) -> None:
        """Say once in the error log that the call in progress hangs, once it does."""
        if self.hung_for() is not None:
            with self._cond:
                self._report_hang()

    def defer(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the worker once the call in progress returns (a hung source's last
        work: the rows and the closing of a run log that hung at close), even after ``close``.
        Its errors go to the error log."""
        with self._cond:
            self._deferred.append(fn)
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        """A call (or deferred work) is in progress: a new call would return ``HUNG``."""
        with self._cond:
            return self._since is not None

    def hung_for(self) -> float | None:
        """Seconds the call in progress has run, once that is past the timeout; else None."""
        with self._cond:
            since = self._since
        if since is None:
            return None
        elapsed = self._monotonic() - since
        return elapsed if elapsed >= self.timeout else None

    def on_worker(self) -> bool:
        """Whether the calling thread is this source's worker (a call made from inside one)."""
        return self._thread is not None and self._thread is threading.current_thread()

    def close(self, timeout: float) -> bool:
        """Let the worker end once idle; wait at most ``timeout``. False when a call still hangs
        (the daemon thread then ends when that call returns)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        if self.hung_for() is not None:
            return False  # hung already: joining would only spend the caller's wait
        thread.join(timeout)
        return not thread.is_alive()

    def _start_worker(self) -> None:
        # Under the lock.
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"nbmonitor-{self.name}", daemon=True
            )
            self._thread.start()

    def _report_hang(self) -> None:
        # Under the lock. Once per hang: the status says it continuously.
        if self._reported or self._since is None:
            return
        self._reported = True
        elapsed = self._monotonic() - self._since
        self._errors.add(
            self.name,
            TimeoutError(f"{self.what} has not returned for {elapsed:.1f} s; going on without it"),
        )

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: self._job is not None or bool(self._deferred) or self._stopping
                )
                job, self._job = self._job, None
                if job is None and self._deferred:
                    job = self._deferred.pop(0)
                    self._since, self._abandoned = self._monotonic(), True
            if job is None:
                return
            cpu = time.thread_time()
            outcome: tuple[bool, object]
            try:
                outcome = (True, job())
            except BaseException as exc:  # the worker must outlive any call
                outcome = (False, exc)
            with self._cond:
                self.cpu_used += time.thread_time() - cpu
                self._since = None
                self._reported = False
                if self._abandoned:
                    if not outcome[0]:
                        assert isinstance(outcome[1], BaseException)
                        self._errors.add(self.name, outcome[1])
                else:
                    self._outcome = outcome
                self._cond.notify_all()


class Sources:
    """The sampler's calls that can hang: system sampling, run-log writing, view updates."""

    def __init__(self, errors: ErrorLog, interval: float, monotonic: Callable[[], float]) -> None:
        self.sample = Isolated(
            "sample", "system sampling", errors, max(1.0, 2 * interval), monotonic
        )
        self.runlog = Isolated("runlog", "run log writing", errors, 2.0, monotonic)
        self.view = Isolated("view", "dashboard update", errors, 2.0, monotonic)

    def all(self) -> tuple[Isolated, ...]:
        return (self.sample, self.runlog, self.view)

    def hung(self) -> dict[str, float]:
        """What each hung source does → seconds its call has run."""
        out: dict[str, float] = {}
        for source in self.all():
            elapsed = source.hung_for()
            if elapsed is not None:
                out[source.what] = elapsed
        return out

    def on_worker(self) -> bool:
        """Whether the calling thread is one of these sources' workers."""
        return any(source.on_worker() for source in self.all())

    def close(self, timeout: float) -> None:
        for source in self.all():
            source.close(timeout / 3)
