"""``list_runs("runs/")``: the runs in a folder as a table, newest first, for comparing them.

Each row costs a few small reads, never a full parse: meta.json; the step count from meta.json
(closed runs) or from the sidecar's chunk spans plus the newlines past them; the final loss by
reading steps.jsonl backwards from its end until a record with ``loss`` turns up.
"""

from __future__ import annotations

import html
import math
import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nbmonitor.runs.decode import decode_lines
from nbmonitor.runs.format import STREAMS, RunCorruptError, RunNotFoundError
from nbmonitor.runs.job import JobFiles
from nbmonitor.runs.layout import LAYOUT
from nbmonitor.runs.reader import Run
from nbmonitor.runs.sidecar import read_chunks

COLUMNS = ("name", "start", "steps", "status", "final_loss", "backend", "path")

_BLOCK = 1 << 16
# How far back from the end to look for the last loss: a run that logs loss rarely shows NaN
# rather than costing a scan of its whole file.
_LOSS_SCAN_BYTES = 8 << 20


def count_rows(run: Run, stream: str = "steps") -> int:
    """Records in ``stream``: chunk spans from the sidecar, then newlines past the last chunk."""
    path = run.file(stream)
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    rows, start = 0, 0
    sidecar = run.meta.get("sidecar")
    if STREAMS[stream].sidecar and isinstance(sidecar, str):
        blocks, start = read_chunks(run.path / sidecar / stream, size, spans_only=True)
        rows = sum(n for _, n in blocks)
    with open(path, "rb") as f:
        f.seek(start)
        while block := f.read(1 << 20):
            rows += block.count(b"\n")
    return rows


def last_value(path: pathlib.Path, key: str) -> float:
    """The value of ``key`` in the last whole record of a JSON Lines file that has it (NaN if
    none within the last few MiB)."""
    needle = f'"{key}":'.encode()
    try:
        with open(path, "rb") as f:
            end = pos = f.seek(0, os.SEEK_END)
            carry = b""  # the end of a line that starts in an earlier block
            while pos > 0 and end - pos < _LOSS_SCAN_BYTES:
                step = min(_BLOCK, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + carry
                if pos + step == end:
                    data = data[: data.rfind(b"\n") + 1]  # the torn last line, if any
                cut = data.find(b"\n") + 1 if pos > 0 else 0
                if pos > 0 and cut == 0:
                    carry = data
                    continue
                carry, data = data[:cut], data[cut:]
                for line in reversed(data.split(b"\n")):
                    if needle in line:
                        records = decode_lines(line + b"\n").records
                        value = records[0].get(key) if records else None
                        if isinstance(value, (int, float)):
                            return float(value)
    except OSError:
        pass
    return math.nan


def _backend(meta: dict[str, Any]) -> str:
    b = meta.get("backend")
    if isinstance(b, dict):
        return str(b.get("name", ""))
    return "" if b is None else str(b)


def _row(path: pathlib.Path) -> tuple[tuple[float, str], dict[str, object]]:
    """(sort key, row) for the run at ``path``; a damaged meta.json is a row, not an error."""
    try:
        run = Run(path)
    except RunCorruptError:
        row: dict[str, object] = {**dict.fromkeys(COLUMNS, ""), "name": path.name, "steps": 0,
                                  "status": "unreadable", "final_loss": math.nan,
                                  "path": str(path)}  # fmt: skip
        return (0.0, path.name), row
    meta = run.meta
    if meta.get("layout") == LAYOUT:
        return _job_row(path, meta)
    steps = meta.get("steps")
    started = meta.get("start_timestamp")
    row = {
        "name": path.name,
        "start": str(meta.get("start_time", "")),
        "steps": steps if isinstance(steps, int) else count_rows(run),
        "status": run.status,
        "final_loss": last_value(run.file("steps"), "loss"),
        "backend": _backend(meta),
        "path": str(path),
    }
    # Folder names begin with the local start time, so they order runs without the stamp too.
    return (float(started) if isinstance(started, (int, float)) else 0.0, path.name), row


def _job_row(
    path: pathlib.Path, meta: dict[str, Any]
) -> tuple[tuple[float, str], dict[str, object]]:
    """A job of several ranks (runs/layout.py) as one row: its first rank's steps and loss,
    the worst status of its ranks."""
    job = JobFiles(path)
    first = next(iter(job.ranks.values()), None)
    row: dict[str, object] = dict.fromkeys(COLUMNS, "")
    if first is not None:
        row = _row(first.path)[1]
    started = meta.get("start_timestamp")
    row.update(
        name=path.name,
        status=job.status,
        backend=f"{row.get('backend', '')} ({len(job.ranks)}/{job.world_size} ranks)",
        path=str(path),
    )
    return (float(started) if isinstance(started, (int, float)) else 0.0, path.name), row


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class RunTable:
    """Runs as rows (dicts with the keys of :data:`COLUMNS`), newest first."""

    rows: list[dict[str, object]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, object]]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> dict[str, object]:
        return self.rows[i]

    def __str__(self) -> str:
        cells = [list(COLUMNS)] + [[_fmt(r[c]) for c in COLUMNS] for r in self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
                 for row in cells]  # fmt: skip
        if not self.rows:
            lines.append("(no runs)")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(f"<th style='text-align:left'>{e(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td style='text-align:left'>{e(_fmt(r[c]))}</td>" for c in COLUMNS)
            + "</tr>"
            for r in self.rows
        )  # fmt: skip
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError(
                "nbmonitor: RunTable.to_pandas() needs pandas; pip install pandas "
                "(or use .rows, a list of dicts)."
            ) from exc
        return pd.DataFrame(self.rows, columns=list(COLUMNS))


def list_runs(root: str | os.PathLike[str] = "runs") -> RunTable:
    """The runs directly under ``root`` (the ``run_dir`` they were written to), newest first.

    Folders without meta.json are not runs and are left out; raises RunNotFoundError if
    ``root`` is not a folder.
    """
    base = pathlib.Path(root)
    if not base.is_dir():
        what = "not a folder" if base.exists() else "not found"
        raise RunNotFoundError(
            f"nbmonitor: cannot list runs in '{base}' ({what}); pass the run_dir= the runs "
            "were written to (default 'runs')."
        )
    keyed = [_row(p) for p in base.iterdir() if p.is_dir() and (p / "meta.json").is_file()]
    keyed.sort(key=lambda kr: kr[0], reverse=True)
    return RunTable([row for _, row in keyed])


__all__ = ["COLUMNS", "RunTable", "count_rows", "last_value", "list_runs"]
