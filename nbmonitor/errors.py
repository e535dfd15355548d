"""Public exceptions, and ``Guard``: the one way every part of nbmonitor fails without harm.

Every probe (training thread), sampler stage and sink sits behind a Guard. A failure is
counted and kept with a timestamp in the shared ``ErrorLog`` (shown as ``mon.status`` and
``mon.errors``) and never reaches the training loop; after ``limit`` failures in a row the part
is switched off, and where the cause can pass (a full disk) it is tried again ``retry_after``
seconds later. Importing this module loads no torch.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

# After this many consecutive failures a guarded part is switched off.
MAX_FAILURES_IN_A_ROW = 5


class NonFiniteError(FloatingPointError):
    """Raised into the training loop with ``on_nan="raise"``, from ``optimizer.step()`` before
    the bad update is applied; its message names where NaN/Inf first appeared (the first
    parameters, and with ``check_forward=True`` the first module)."""


class StopTraining(BaseException):
    """Raised into the training loop from ``optimizer.step()``, after the update, when a stop
    was asked for (``mon.stop()``, the dashboard, ``nbmonitor ctl RUN stop``): it ends a plain
    loop at a step boundary. A ``BaseException``, like ``KeyboardInterrupt``, so that the
    loop's own ``except Exception`` does not swallow it. In a notebook the cell ends with one
    line and no traceback; in a thread, the thread ends without one; in a script's main
    thread the one raised is a ``StopTrainingExit``, also a ``SystemExit``: the script exits
    with status 0. ``step`` is the last step taken. See docs/steering.md."""

    def __init__(self, message: str = "training stopped", step: int = 0) -> None:
        super().__init__(message)
        self.step = step


class StopTrainingExit(StopTraining, SystemExit):
    """The ``StopTraining`` raised in a script's main thread: a ``SystemExit`` with code 0, so
    that the script exits cleanly (status 0, no traceback)."""

    def __init__(self, message: str = "training stopped", step: int = 0) -> None:
        super().__init__(message, step)
        self.code = 0


class RunDirError(RuntimeError):
    """A run directory that cannot be created, written or read; the message says what to do.

    ``attach`` raises it when the run directory cannot be created or written;
    ``nbmonitor.open`` raises ``nbmonitor.runs.RunNotFoundError`` (a ``FileNotFoundError`` and
    a ``RunDirError``) for a path without ``meta.json``."""


@dataclass(frozen=True)
class ErrorEntry:
    time: float
    source: str
    message: str

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time))
        return f"{stamp} {self.source}: {self.message}"


class ErrorLog:
    """What failed, when, and how often; shared by probes (training thread) and the sampler."""

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


class Guard:
    """The failure accounting of one named part.

    ``on`` is a plain attribute so that a hook can test it in one load; ``failed`` counts a
    failure (and switches the part off after ``limit`` in a row); ``ok`` ends a run of
    failures. With ``retry_after`` a part switched off is tried again that many seconds later
    (``on`` turns true again when ``ready()`` is asked); without it, it stays off.
    """

    __slots__ = ("_clock", "_off_until", "in_a_row", "limit", "log", "name", "on", "retry_after")

    def __init__(
        self,
        name: str,
        log: ErrorLog,
        *,
        limit: int = MAX_FAILURES_IN_A_ROW,
        retry_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.log = log
        self.limit = limit
        self.retry_after = retry_after
        self.on = True
        self.in_a_row = 0
        self._clock = clock
        self._off_until = 0.0

    def failed(self, exc: BaseException) -> None:
        self.in_a_row += 1
        self.log.add(self.name, exc)
        if self.in_a_row >= self.limit:
            self.on = False
            self.log.disabled.add(self.name)
            if self.retry_after is not None:
                self._off_until = self._clock() + self.retry_after

    def ok(self) -> None:
        self.in_a_row = 0

    def ready(self) -> bool:
        """Whether the part may run now (a part switched off comes back after retry_after)."""
        if self.on:
            return True
        if self.retry_after is None or self._clock() < self._off_until:
            return False
        self.on = True
        self.in_a_row = self.limit - 1  # one more failure switches it off again
        self.log.disabled.discard(self.name)
        return True

    def run(self, fn: Callable[[], None]) -> bool:
        """Call ``fn`` if the part is on; True when it ran without an exception."""
        if not self.ready():
            return False
        try:
            fn()
        except Exception as exc:
            self.failed(exc)
            return False
        if self.in_a_row:
            self.ok()
        return True


__all__ = [
    "ErrorEntry",
    "ErrorLog",
    "Guard",
    "NonFiniteError",
    "RunDirError",
    "StopTraining",
    "StopTrainingExit",
]
