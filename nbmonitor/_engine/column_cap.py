"""Which logged keys the live steps store keeps in memory.

A dense store column costs 8 bytes per row it can hold: ~1 MiB once a run is past 65,536 steps
(docs/reliability.md). A key logged now and then is held sparse (``store.py``), at about the
cost of its values, but one logged on most rows is a dense column, and a loop that logs ever
new keys (``mon.log(**{f"val_{epoch}": x})``) would add columns without end. So the store keeps
the first ``limit`` keys; rows keep the rest on disk only (the run log has every key, and
``nbmonitor.open(run_dir).history()`` reads them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nbmonitor.runs.column_rows import ColumnRows

# Columns of the live steps store, the measured ones (about ten) included: at most
# 128 x ~1 MiB however many keys are logged.
MAX_COLUMNS = 128


class ColumnCap:
    def __init__(self, limit: int = MAX_COLUMNS) -> None:
        self.limit = limit
        self.kept: set[str] = set()
        self.first_refused: str | None = None  # the first key left out, for the one notice

    def _admit(self, new: Sequence[str]) -> bool:
        """Keep the keys of ``new`` (not kept yet) while there is room; True if one was
        refused."""
        kept, refused = self.kept, False
        for key in new:
            if len(kept) < self.limit:
                kept.add(key)
            else:
                refused = True
                if self.first_refused is None:
                    self.first_refused = key
        return refused

    def filter(self, rows: Sequence[dict[str, float]]) -> Sequence[dict[str, float]]:
        """``rows`` with only the keys the store keeps (the same objects when nothing is cut)."""
        kept = self.kept
        out: list[dict[str, float]] | None = None
        for i, row in enumerate(rows):
            new = [key for key in row if key not in kept]
            if not new:
                if out is not None:
                    out.append(row)
                continue
            if self._admit(new):
                if out is None:
                    out = list(rows[:i])
                out.append({k: v for k, v in row.items() if k in kept})
            elif out is not None:
                out.append(row)
        return rows if out is None else out

    def filter_columns(
        self, rows: Sequence[dict[str, float]], columns: Mapping[str, Sequence[float]]
    ) -> tuple[Sequence[dict[str, float]], Mapping[str, Sequence[float]]]:
        """``filter`` of ``rows`` given also as ``columns`` (keys in the rows' order, every row
        with every key but for some of the first rows' last key): the keys are checked once,
        not row by row. The same objects when nothing is cut; rows held as columns
        (``ColumnRows``) stay so."""
        kept = self.kept
        if not self._admit([key for key in columns if key not in kept]):
            return rows, columns
        if isinstance(rows, ColumnRows):
            absent = {k: n for k, n in rows.absent.items() if k in kept}
            cut = ColumnRows({k: v for k, v in rows.columns.items() if k in kept}, absent)
            return cut, cut.columns
        rows = [{k: v for k, v in row.items() if k in kept} for row in rows]
        return rows, {k: v for k, v in columns.items() if k in kept}
