"""The Sink protocol: where each sampler tick's new rows go (the run log, later exporters).

The sampler builds one :class:`Batch` per tick and hands it to a :class:`FanOut`, which gives
it to every sink in turn; a sink that raises is reported through ``on_error`` (the monitor's
Guard counts it, switches it off after repeated failures) and never stops the others.
Sampler thread only (``close`` may come from the main thread at shutdown); no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

Rows = Sequence[Mapping[str, object]]


@dataclass(frozen=True)
class Batch:
    """The new rows of one tick, per stream (``steps``, ``system``, ``events``, ``layers``, ...;
    see :data:`nbmonitor.runs.format.STREAMS`). A stream with no new rows may be absent."""

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
    """Several sinks behind one: each call goes to every sink; a sink's exception goes to
    ``on_error(sink.name, exc)`` and the next sink still runs."""

    name = "fanout"

    def __init__(
        self, sinks: Sequence[Sink], on_error: Callable[[str, BaseException], None]
    ) -> None:
        self.sinks = list(sinks)
        self._on_error = on_error

    def _each(self, call: Callable[[Sink], None]) -> None:
        for sink in self.sinks:
            try:
                call(sink)
            except Exception as exc:
                self._on_error(sink.name, exc)

    def write(self, batch: Batch) -> None:
        if batch:
            self._each(lambda s: s.write(batch))

    def flush(self) -> None:
        self._each(lambda s: s.flush())

    def close(self, final_meta: Mapping[str, object]) -> None:
        # A sink's close should not raise; one that does still must not cost the others.
        self._each(lambda s: s.close(final_meta))


__all__ = ["Batch", "FanOut", "NullSink", "Rows", "Sink"]
