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

Rows held as columns (``nbmonitor.runs.column_rows.ColumnRows``: a tick's runs of alike steps)
are kept and handed on as they came, no row made of them here: the run log encodes them from
their columns and its writer process is sent them as columns; only a sink that reads rows (an
exporter's per-row API) makes each row, as it reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nbmonitor.runs.column_rows import ColumnRows, RowParts, row_parts
from nbmonitor.runs.format import STREAMS
from nbmonitor.sinks import Batch

# While the sinks do not take their rows (the run log hangs), at most this many rows per
# stream wait for them; older ones are dropped (and counted) rather than pile up without bound.
MAX_WAITING_ROWS = 100_000


class Outbox:
    """The rows taken per stream since the last :meth:`take`, at most ``limit`` per stream."""

    __slots__ = ("_counts", "_dropped", "_rows", "dropped", "limit")

    def __init__(self, limit: int | None = None) -> None:
        limit = MAX_WAITING_ROWS if limit is None else limit
        if limit <= 0:
            raise ValueError(f"Outbox: limit must be > 0, got {limit!r}")
        self.limit = limit
        # Per stream, its parts oldest first: rows held as columns (``ColumnRows``, a run of
        # alike steps) as they came, other rows in lists of this outbox's own. None: closed (no
        # reader), nothing is kept.
        self._rows: dict[str, list[Sequence[Mapping[str, object]]]] | None = None
        self._counts: dict[str, int] = {}  # rows per stream in its parts
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
        """Keep ``rows`` of ``stream``, oldest first (nothing while closed). Rows held as
        columns are kept as they are: no row is made of them here."""
        kept = self._rows
        if kept is None:
            return
        parts = kept.get(stream)
        if parts is None:
            parts = kept[stream] = []
        given = row_parts(rows) if isinstance(rows, Sequence) else [list(rows)]
        added = 0
        for part in given:
            if not len(part):
                continue
            added += len(part)
            if isinstance(part, ColumnRows):
                parts.append(part)
            elif parts and type(parts[-1]) is list:  # a list made here: not the caller's
                parts[-1].extend(part)
            else:
                parts.append(list(part))
        count = self._counts[stream] = self._counts.get(stream, 0) + added
        over = count - self.limit
        if over > 0:
            self._counts[stream] = self.limit
            self._dropped[stream] = self._dropped.get(stream, 0) + over
            self.dropped[stream] = self.dropped.get(stream, 0) + over
            while over:
                first = parts[0]
                if len(first) <= over:
                    over -= len(first)
                    del parts[0]
                elif isinstance(first, ColumnRows):
                    parts[0] = first.cut(over, len(first))
                    over = 0
                else:
                    del first[:over]  # type: ignore[attr-defined]
                    over = 0

    def waiting(self, stream: str) -> int:
        """How many rows of ``stream`` wait for the reader."""
        return self._counts.get(stream, 0) if self._rows is not None else 0

    def take(self) -> Batch:
        """Every row kept since the last take, per stream (streams without rows left out),
        in the order of the run folder's streams (``runs.format.STREAMS``: steps first),
        whatever order they came in. A stream's rows are one sequence: one list, the parts
        held as columns joined when they have the same keys, else a ``RowParts`` of its
        parts (rows held as columns are made into rows only by a reader that needs rows)."""
        kept = self._rows
        if not kept:
            return Batch({})
        self._rows = {}
        self._counts = {}
        ordered = {stream: _one(kept.pop(stream)) for stream in STREAMS if kept.get(stream)}
        ordered.update((stream, _one(parts)) for stream, parts in kept.items() if parts)
        return Batch(ordered)

    def take_dropped(self) -> dict[str, int]:
        """Rows dropped per stream past the bound since the last call (the reader says so)."""
        dropped, self._dropped = self._dropped, {}
        return dropped


def _one(parts: list[Sequence[Mapping[str, object]]]) -> Sequence[Mapping[str, object]]:
    """A stream's parts as one sequence (``Outbox.take``)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, ColumnRows) for p in parts):
        joined = ColumnRows.joined(parts)  # type: ignore[arg-type]
        if joined is not None:
            return joined
    return RowParts(parts)


__all__ = ["MAX_WAITING_ROWS", "Outbox"]
