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
from nbmonitor.runs.files import RunFolder
from nbmonitor.runs.format import (
    META,
    STREAMS,
    RunCorruptError,
    RunDirError,
    RunNotFoundError,
    RunUnreadableError,
    RunUnsafeError,
)
from nbmonitor.runs.job import JobFiles
from nbmonitor.runs.layout import LAYOUT
from nbmonitor.runs.reader import Run
from nbmonitor.runs.sidecar import read_chunks
from nbmonitor.runs.text import printable

COLUMNS = ("name", "start", "steps", "status", "final_loss", "backend", "path")

_BLOCK = 1 << 16
# How far back from the end to look for the last loss: a run that logs loss rarely shows NaN
# rather than costing a scan of its whole file.
_LOSS_SCAN_BYTES = 8 << 20
# A text cell (start time, backend) from meta.json is cut to this many characters.
_CELL = 48


def count_rows(run: Run, stream: str = "steps") -> int:
    """Records in ``stream``: chunk spans from the sidecar, then newlines past the last chunk
    (at most the stream's size bound)."""
    parts = [run.file(stream).name]
    try:
        size = run.folder.size(parts)
    except FileNotFoundError:
        return 0
    rows, start = 0, 0
    sidecar = run.sidecar_parts(stream)
    if sidecar is not None:
        blocks, start = read_chunks(run.folder, sidecar, parts, size, spans_only=True)
        rows = sum(b.rows for b in blocks)
    end = min(size, STREAMS[stream].max_bytes)
    with run.folder.opened(parts) as fd:
        at = start
        while at < end:
            block = os.pread(fd, min(1 << 20, end - at), at)
            if not block:
                break
            rows += block.count(b"\n")
            at += len(block)
    return rows


def last_value(path: pathlib.Path, key: str, max_line: int = STREAMS["steps"].max_line) -> float:
    """The value of ``key`` in the last whole record of a JSON Lines file that has it (NaN if
    none within the last few MiB; lines past ``max_line`` are passed over)."""
    needle = f'"{key}":'.encode()
    try:
        with RunFolder(path.parent).opened([path.name]) as f:
            end = pos = os.fstat(f).st_size
            carry = b""  # the end of a line that starts in an earlier block
            while pos > 0 and end - pos < _LOSS_SCAN_BYTES:
                step = min(_BLOCK, pos)
                pos -= step
                data = os.pread(f, step, pos) + carry
                if pos + step == end:
                    data = data[: data.rfind(b"\n") + 1]  # the torn last line, if any
                cut = data.find(b"\n") + 1 if pos > 0 else 0
                if pos > 0 and cut == 0:
                    carry = data if len(data) <= max_line else b""
                    continue
                carry, data = data[:cut], data[cut:]
                for line in reversed(data.split(b"\n")):
                    if needle in line and len(line) <= max_line:
                        records = decode_lines(line + b"\n").records
                        value = records[0].get(key) if records else None
                        if type(value) in (int, float):
                            try:
                                return float(value)  # type: ignore[arg-type]
                            except OverflowError:
                                return math.nan
    except (OSError, RunDirError):
        pass
    return math.nan


def _cell(value: object) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= _CELL else text[: _CELL - 3] + "..."


def _backend(meta: dict[str, Any]) -> str:
    b = meta.get("backend")
    if isinstance(b, dict):
        return _cell(b.get("name", ""))
    return _cell(b)


def why(exc: BaseException) -> str:
    """A few words on why a run could not be read, for a table cell."""
    if isinstance(exc, RunUnsafeError):
        return "a file is not a regular file inside the run"
    if isinstance(exc, RunUnreadableError):
        return "permission denied" if "ermission" in str(exc) else "cannot read a file"
    if isinstance(exc, RunCorruptError):
        return "damaged meta.json" if META in str(exc) else "damaged files"
    if isinstance(exc, RunNotFoundError):
        return "no meta.json"
    return type(exc).__name__


def _unreadable(
    path: pathlib.Path, exc: BaseException
) -> tuple[tuple[float, str], dict[str, object]]:
    row: dict[str, object] = {**dict.fromkeys(COLUMNS, ""), "name": path.name, "steps": 0,
                              "status": f"unreadable ({why(exc)})", "final_loss": math.nan,
                              "path": str(path)}  # fmt: skip
    return (0.0, path.name), row


def _row(path: pathlib.Path) -> tuple[tuple[float, str], dict[str, object]]:
    """(sort key, row) for the run at ``path``; a run that cannot be read is a row saying
    why, never an error (one bad entry never costs the listing)."""
    try:
        return _row_of(path)
    except Exception as exc:  # isolation: whatever one hostile entry does stays in its row
        return _unreadable(path, exc)


def _start_key(meta: dict[str, Any], path: pathlib.Path) -> tuple[float, str]:
    started = meta.get("start_timestamp")
    if isinstance(started, (int, float)) and math.isfinite(started):
        return float(started), path.name
    return 0.0, path.name


def _row_of(path: pathlib.Path) -> tuple[tuple[float, str], dict[str, object]]:
    run = Run(path)
    meta = run.meta
    if meta.get("layout") == LAYOUT:
        return _job_row(path, meta)
    steps = meta.get("steps")
    row: dict[str, object] = {
        "name": path.name,
        "start": _cell(meta.get("start_time", "")),
        "steps": steps if type(steps) is int and steps >= 0 else count_rows(run),
        "status": run.status,
        "final_loss": last_value(run.file("steps"), "loss"),
        "backend": _backend(meta),
        "path": str(path),
    }
    # Folder names begin with the local start time, so they order runs without the stamp too.
    return _start_key(meta, path), row


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
    row.update(
        name=path.name,
        status=job.status,
        backend=f"{row.get('backend', '')} ({len(job.ranks)}/{job.world_size} ranks)",
        path=str(path),
    )
    return _start_key(meta, path), row


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
        # Every cell came from a run folder: control characters never reach the terminal.
        cells = [list(COLUMNS)] + [[printable(_fmt(r[c])) for c in COLUMNS] for r in self.rows]
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

    Each row: name, start, steps, status, final loss, backend, path. A table in a notebook,
    text with ``print()``, ``.to_pandas()`` for a DataFrame. Folders without meta.json are not
    runs and are left out; raises RunNotFoundError if ``root`` is not a folder.
    """
    base = pathlib.Path(root)
    if not base.is_dir():
        what = "not a folder" if base.exists() else "not found"
        raise RunNotFoundError(
            f"nbmonitor: cannot list runs in '{base}' ({what}); pass the run_dir= the runs "
            "were written to (default 'runs')."
        )
    try:
        with os.scandir(base) as it:
            # Real folders only: a symlink in a shared runs/ folder may point anywhere.
            entries = [e.name for e in it if e.is_dir(follow_symlinks=False)]
    except OSError as exc:
        raise RunUnreadableError(
            f"nbmonitor: cannot list runs in '{base}' ({exc.strerror or exc}); check its "
            "permissions."
        ) from None
    keyed = []
    for name in entries:
        path = base / name
        try:
            found = RunFolder(path).listdir()
        except Exception as exc:  # a folder we may not list: a row saying so
            keyed.append(_unreadable(path, exc))
            continue
        if META in found:
            keyed.append(_row(path))
    keyed.sort(key=lambda kr: kr[0], reverse=True)
    return RunTable([row for _, row in keyed])


__all__ = ["COLUMNS", "RunTable", "count_rows", "last_value", "list_runs"]
