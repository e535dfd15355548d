"""What the run model took since its reader's last read: the sinks' rows, kept by the model.

Every row the run model takes (``run_model.RunModel``'s ``add_*`` methods) is also put here,
per stream, as the run log writes it; the one reader (a live run's sampler, which hands them
to its sinks as one ``Batch`` a tick) takes them all at once with :meth:`Outbox.take`. So
what the sinks get is what the model holds, by construction: there is no second list for a
caller to keep in step.

Nothing is kept until a reader :meth:`opens <Outbox.open>` it: a run read from disk for its
dashboard has no sinks, and keeps no second copy of its rows.

Bounded: while the reader does not take (the run log hangs, the sinks' stage is switched
off), at most ``limit`` rows per stream wait; past that the oldest are dropped and counted,
and :meth:`Outbox.take_dropped` says how many since it last asked (``dropped``: in all), for
the reader to report. Sampler thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nbmonitor.runs.format import STREAMS
from nbmonitor.sinks import Batch

# While the sinks do not take their rows (the run log hangs), at most this many rows per
# stream wait for them; older ones are dropped (and counted) rather than pile up without bound.
MAX_WAITING_ROWS = 100_000


class Outbox:
    """The rows taken per stream since the last :meth:`take`, at most ``limit`` per stream."""

    __slots__ = ("_dropped", "_rows", "dropped", "limit")

    def __init__(self, limit: int | None = None) -> None:
        limit = MAX_WAITING_ROWS if limit is None else limit
        if limit <= 0:
            raise ValueError(f"Outbox: limit must be > 0, got {limit!r}")
        self.limit = limit
        # None: closed (no reader), nothing is kept.
        self._rows: dict[str, list[Mapping[str, object]]] | None = None
        self._dropped: dict[str, int] = {}  # since the last take_dropped()
        self.dropped: dict[str, int] = {}  # in all

    @property
    def is_open(self) -> bool:
        return self._rows is not None

    def open(self) -> None:
        """Start keeping rows (the reader, before the first row it must see). Idempotent."""
        if self._rows is None:
            self._rows = {}

    def put(self, stream: str, rows: Iterable[Mapping[str, object]]) -> None:
        """Keep ``rows`` of ``stream``, oldest first (nothing while closed)."""
        kept = self._rows
        if kept is None:
            return
        waiting = kept.get(stream)
        if waiting is None:
            waiting = kept[stream] = []
        waiting.extend(rows)
        over = len(waiting) - self.limit
        if over > 0:
            del waiting[:over]
            self._dropped[stream] = self._dropped.get(stream, 0) + over
            self.dropped[stream] = self.dropped.get(stream, 0) + over

    def waiting(self, stream: str) -> int:
        """How many rows of ``stream`` wait for the reader."""
        kept = self._rows
        return len(kept.get(stream, ())) if kept is not None else 0

    def take(self) -> Batch:
        """Every row kept since the last take, per stream (streams without rows left out),
        in the order of the run folder's streams (``runs.format.STREAMS``: steps first),
        whatever order they came in."""
        kept = self._rows
        if not kept:
            return Batch({})
        self._rows = {}
        ordered = {stream: kept.pop(stream) for stream in STREAMS if kept.get(stream)}
        ordered.update((stream, rows) for stream, rows in kept.items() if rows)
        return Batch(ordered)

    def take_dropped(self) -> dict[str, int]:
        """Rows dropped per stream past the bound since the last call (the reader says so)."""
        dropped, self._dropped = self._dropped, {}
        return dropped


__all__ = ["MAX_WAITING_ROWS", "Outbox"]
