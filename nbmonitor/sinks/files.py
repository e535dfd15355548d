"""Parquet and CSV: a run's tables as files, and as pandas DataFrames.

``frames(run)`` gives the run's four tables (``history``, ``system``, ``layers``, ``events``)
as DataFrames: the numeric ones exactly as ``run.history()`` reads them (float64 columns, NaN
where a row lacks a key), events as records. ``write_tables`` writes one file per table that
has rows (``history.parquet`` ...), each through a temporary file and ``os.replace``, so a
reader never sees half a file. pandas and pyarrow come with the extra ``files``.

Live, the ``Parquet``/``CSV`` exporters write these files when the run closes, from the run
folder: Parquet is written whole, not appended to, and the run log already is the live
full-resolution record, so nothing is kept in memory meanwhile and the training pays nothing.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nbmonitor._atomic import atomic_path
from nbmonitor.runs import Run
from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.exporter import ExportContext, ExportError, missing

Format = Literal["parquet", "csv"]
# The tables, and the stream each is read from.
TABLES = {"history": "steps", "system": "system", "layers": "layers", "events": "events"}


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise missing("pandas", "pandas", "files") from None
    return pd


def frames(run: Run) -> dict[str, Any]:
    """The run's tables as pandas DataFrames: ``history``, ``system``, ``layers`` (float64
    columns as the run reads them) and ``events`` (one row per event)."""
    pd = _pandas()
    out: dict[str, Any] = {}
    for table, stream in TABLES.items():
        if stream == "events":
            out[table] = pd.DataFrame.from_records(run.records("events"))
        else:
            out[table] = pd.DataFrame(dict(run.columns(stream)))
    return out


def write_tables(run: Run, out: str | os.PathLike[str], fmt: Format) -> list[pathlib.Path]:
    """Write the run's tables that have rows into ``out`` as ``<table>.<fmt>``; the paths."""
    pd = _pandas()
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise missing("Parquet", "pyarrow", "files") from None
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for table, frame in frames(run).items():
        if frame.empty:
            continue
        if table == "events":
            # Events carry free-form fields (lists, dicts): as JSON text in a file format
            # that holds only scalars.
            frame = frame.map(
                lambda v: pd.io.json.ujson_dumps(v) if isinstance(v, (list, dict)) else v
            )
        path = folder / f"{table}.{fmt}"
        with atomic_path(path) as tmp:  # whole files only, an existing one kept till then
            if fmt == "parquet":
                frame.to_parquet(tmp, index=False)
            else:
                frame.to_csv(tmp, index=False)
        written.append(path)
    return written


@dataclass(frozen=True)
class Parquet:
    """Export the run's tables as Parquet files in ``out`` (default: ``<run folder>/parquet``),
    written when the run closes (from disk: at once)."""

    out: str | os.PathLike[str] | None = None
    name: str = "parquet"
    format: Format = "parquet"

    def open(self, context: ExportContext) -> FilesSink:
        _pandas()
        if self.format == "parquet":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise missing("Parquet", "pyarrow", "files") from None
        if context.run_dir is None:
            raise ExportError(f"nbmonitor: export to {self.name} needs a run folder to read")
        if self.out is not None:
            folder = pathlib.Path(self.out)
            if context.rank is not None:
                folder = folder / f"rank{context.rank}"
        else:
            folder = context.run_dir / self.format
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ExportError(
                f"nbmonitor: cannot write {self.name} files to '{folder}' "
                f"({exc.strerror or type(exc).__name__}); pass out= a writable folder"
            ) from None
        return FilesSink(self.name, context.run_dir, folder, self.format)


@dataclass(frozen=True)
class CSV(Parquet):
    """Export the run's tables as CSV files in ``out`` (default: ``<run folder>/csv``),
    written when the run closes (from disk: at once)."""

    name: str = "csv"
    format: Format = "csv"


class FilesSink:
    """Writes the run folder's tables as files when it closes (see the module docstring)."""

    reads_folder = True  # from disk there is nothing to push through it: close() reads

    def __init__(self, name: str, run_dir: pathlib.Path, out: pathlib.Path, fmt: Format) -> None:
        self.name = name
        self.run_dir = run_dir
        self.out = out
        self.format = fmt
        self.written: list[pathlib.Path] = []
        self._closed = False

    def write(self, batch: Batch) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self, final_meta: Mapping[str, object]) -> None:
        if self._closed:
            return
        self._closed = True
        # The one sink whose close may raise (the files are written here): FanOut reports it
        # as ``sink:<name>`` and still closes the others.
        self.written = write_tables(Run(self.run_dir), self.out, self.format)


__all__ = ["CSV", "TABLES", "FilesSink", "Parquet", "frames", "write_tables"]
