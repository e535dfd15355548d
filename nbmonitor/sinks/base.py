"""The Sink protocol: where each sampler tick's new rows go (the run log, later exporters).

The sampler builds one :class:`Batch` per tick and hands it to a :class:`FanOut`, which gives
it to every sink in turn, each behind its own ``Guard``: a sink that raises is counted in the
error log, switched off after repeated failures in a row (and tried again ``retry_after``
seconds later: a full disk can pass), and never stops the others.
Sampler thread only (``close`` may come from the main thread at shutdown); no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nbmonitor.errors import ErrorLog, Guard

Rows = Sequence[Mapping[str, object]]


@dataclass(frozen=True)
class Batch:
    """The new rows of one tick, per stream (``steps``, ``system``, ``events``, ``layers``, ...;
    see :data:`nbmonitor.runs.format.STREAMS`). A stream with no new rows may be absent. A
    stream's rows may be held as columns (``nbmonitor.runs.column_rows.ColumnRows``, or parts
    in a ``RowParts``): reading a row makes its dict; a sink that can use the columns checks."""

    streams: Mapping[str, Rows] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.streams.values())


@runtime_checkable
class Sink(Protocol):
    """Receives every tick's rows. ``write`` and ``flush`` may raise (the caller guards them);
    ``close`` never raises: it is the last thing a closing monitor does."""

    name: str

    def write(self, batch: Batch) -> None:
        """Take this tick's rows (may buffer them)."""

    def flush(self) -> None:
        """Hand what is buffered on (once per tick): a killed process loses at most a tick."""

    def close(self, final_meta: Mapping[str, object]) -> None:
        """Flush, record ``final_meta`` (end_time, steps, status, errors) and release; never
        raises, idempotent."""


@runtime_checkable
class Background(Protocol):
    """A sink that does its work on a thread of its own (an exporter behind its queue,
    ``queued.py``): its close can start before it is waited for, a flush can wait for it, and
    it says when a call into its tool hangs."""

    what: str  # what it does, for the status line ("MLflow export")

    def begin_close(self, final_meta: Mapping[str, object]) -> None:
        """Start closing; returns at once (``close`` then waits, bounded)."""

    def settle(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until what it was given is handed on."""

    def hung_for(self) -> float | None:
        """Seconds its call in progress has run, once that counts as hung; else None."""


class NullSink:
    """A sink that keeps nothing (``run_dir=None``, tests): the null object beside FanOut."""

    name = "null"

    def write(self, batch: Batch) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, final_meta: Mapping[str, object]) -> None:
        pass


class FanOut:
    """Several sinks behind one: each call goes to every sink, each sink behind its own
    ``Guard`` named ``sink:<name>`` in ``errors``; the next sink still runs."""

    name = "fanout"

    def __init__(
        self,
        sinks: Sequence[Sink],
        errors: ErrorLog,
        *,
        retry_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sinks = list(sinks)
        self._errors = errors
        self._clock = clock
        self.guards = [
            Guard(f"sink:{s.name}", errors, retry_after=retry_after, clock=clock) for s in sinks
        ]

    def _each(self, call: Callable[[Sink], None]) -> None:
        for sink, guard in zip(self.sinks, self.guards, strict=True):
            guard.run(lambda sink=sink: call(sink))  # type: ignore[misc]

    def write(self, batch: Batch) -> None:
        if batch:
            self._each(lambda s: s.write(batch))

    def flush(self) -> None:
        self._each(lambda s: s.flush())

    def settle(self, timeout: float) -> bool:
        """Wait until the sinks that work in the background have handed on what they were
        given, ``timeout`` seconds at most for all of them (``mon.flush()``, the final tick)."""
        deadline = self._clock() + timeout
        settled = True
        for sink in self.sinks:
            if isinstance(sink, Background):
                settled = sink.settle(max(0.0, deadline - self._clock())) and settled
        return settled

    def hung(self) -> dict[str, float]:
        """What each sink that hangs does -> seconds its call has run."""
        out: dict[str, float] = {}
        for sink in self.sinks:
            if isinstance(sink, Background):
                elapsed = sink.hung_for()
                if elapsed is not None:
                    out[sink.what] = elapsed
        return out

    def close(self, final_meta: Mapping[str, object]) -> None:
        # Every sink is closed, also one switched off: its files still need closing. A sink's
        # close should not raise; one that does still must not cost the others. The ones in
        # the background start closing together first: several that hang cost one wait.
        for sink in self.sinks:
            if isinstance(sink, Background):
                try:
                    sink.begin_close(final_meta)
                except Exception as exc:
                    self._errors.add(f"sink:{sink.name}", exc)
        for sink in self.sinks:
            try:
                sink.close(final_meta)
            except Exception as exc:
                self._errors.add(f"sink:{sink.name}", exc)


__all__ = ["Background", "Batch", "FanOut", "NullSink", "Rows", "Sink"]
