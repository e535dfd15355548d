"""Reading a run directory: ``open_run(path)`` gives a :class:`Run` whose ``history()``,
``system()``, ``layers()`` and ``events()`` read the files as they are now.

A numeric stream is read from its columnar sidecar (whole chunks, no text parsing) and then
from its JSON Lines past the last chunk; a run without a sidecar (written before it existed,
or killed before its first chunk) is read from the JSON Lines alone, to the same result.
Works while the run is still being written: a torn last line is a write in progress and is
skipped; an unparsable line before the last is corruption and raises.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

from nbmonitor.memory import MemoryBreakdown
from nbmonitor.runs.decode import FloatArray, Record, concat_columns, decode_lines, to_columns
from nbmonitor.runs.format import (
    META,
    STREAMS,
    RunCorruptError,
    RunNotFoundError,
    Stream,
    stream_file,
)
from nbmonitor.runs.sidecar import read_chunks
from nbmonitor.runs.status import run_status

if TYPE_CHECKING:
    from nbmonitor.runs.tail import Tail

_HINT = "pass the folder of one run, e.g. runs/20240101-120000-run"


def run_path(path: object) -> pathlib.Path:
    """``path`` as a Path, or a one-line error naming it (not pathlib's own)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"nbmonitor: open(path) needs a str or os.PathLike, got {type(path).__name__}; "
            "pass a run folder, e.g. mon.run_dir."
        )
    text = os.fspath(path)
    if not isinstance(text, str) or not text or "\0" in text:
        raise ValueError(
            f"nbmonitor: open(path) got {text!r}, which is not a folder name (empty, bytes or "
            "containing NUL); pass a run folder, e.g. mon.run_dir."
        )
    return pathlib.Path(text)


def read_meta(path: pathlib.Path) -> dict[str, Any]:
    """meta.json of the run at ``path``; RunNotFoundError (one line, with a hint) if none."""
    try:
        text = (path / META).read_text(encoding="utf-8")
    except FileNotFoundError:
        what = "not found" if path.exists() else "folder not found"
        raise RunNotFoundError(f"nbmonitor: no run at '{path}' ({META} {what}); {_HINT}.") from None
    except NotADirectoryError:
        raise RunNotFoundError(f"nbmonitor: no run at '{path}' (not a folder); {_HINT}.") from None
    except OSError as exc:  # a name too long, a folder it may not read
        reason = exc.strerror or type(exc).__name__
        raise RunNotFoundError(f"nbmonitor: no run at '{path}' ({reason}); {_HINT}.") from None
    try:
        meta = json.loads(text)
    except ValueError:
        raise RunCorruptError(
            f"nbmonitor: {path / META} is not valid JSON; the run's metadata is damaged."
        ) from None
    return meta if isinstance(meta, dict) else {"meta": meta}


def _read_from(path: pathlib.Path, start: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read()
    except FileNotFoundError:
        return b""


class Run:
    """A run directory on disk, read on demand; works while the run is still being written.

    ``meta`` is meta.json as it was when the run was opened; ``status`` reads it again.
    ``offsets`` holds, per stream read so far, the byte offset its last read ended at (where
    :meth:`tail` picks up).
    """

    path: pathlib.Path
    meta: dict[str, Any]
    offsets: dict[str, int]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = run_path(path)
        self.meta = read_meta(self.path)
        self.offsets = {}

    def file(self, stream: str) -> pathlib.Path:
        """The JSON Lines file of ``stream`` (one of :data:`~nbmonitor.runs.format.STREAMS`)."""
        return self.path / stream_file(self.meta, STREAMS[stream])

    def _text(self, stream: Stream, start: int, rows_before: int) -> list[Record]:
        """The records of ``stream`` after byte ``start``; sets ``offsets``."""
        path = self.file(stream.name)
        whole = _read_from(path, start)
        whole = whole[: whole.rfind(b"\n") + 1]  # a torn last line is a write in progress
        records, bad, lines = decode_lines(whole)
        if bad and bad[0] < lines - 1:  # only the last line may be cut short
            raise RunCorruptError(
                f"nbmonitor: {path} line {rows_before + bad[0] + 1} is not valid JSON; "
                "the file is corrupt (records before it read with the plain-Python recipe "
                "in docs/file-format.md)."
            )
        self.offsets[stream.name] = start + len(whole)
        return records

    def columns(self, stream: str) -> dict[str, FloatArray]:
        """A numeric stream as float64 columns (union of keys in first-seen order, NaN where a
        record lacks a key); ``{}`` if it has no records."""
        s = STREAMS[stream]
        blocks: list[tuple[dict[str, FloatArray], int]] = []
        start = 0
        if s.sidecar and isinstance(self.meta.get("sidecar"), str):
            try:
                size = self.file(stream).stat().st_size
            except OSError:
                size = 0
            blocks, start = read_chunks(self.path / self.meta["sidecar"] / stream, size)
        rows_before = sum(n for _, n in blocks)
        records = self._text(s, start, rows_before)
        if records:
            blocks.append((to_columns(records), len(records)))
        return concat_columns(blocks)

    def records(self, stream: str) -> list[Record]:
        """A stream as a list of dicts, oldest first (the JSON Lines, parsed)."""
        return self._text(STREAMS[stream], 0, 0)

    def history(self) -> dict[str, FloatArray]:
        """steps.jsonl as float64 columns (union of keys, NaN where missing); ``{}`` if none."""
        return self.columns("steps")

    def system(self) -> dict[str, FloatArray]:
        """system.jsonl as float64 columns, like :meth:`history`."""
        return self.columns("system")

    def layers(self) -> dict[str, FloatArray]:
        """layers.jsonl (written every ``layer_every`` steps) as float64 columns."""
        return self.columns("layers")

    def memory(self, step: int | None = None) -> MemoryBreakdown | None:
        """What held memory (``nbmonitor.memory.MemoryBreakdown``) at the newest sampled step,
        or at the newest one at or before ``step``; None if the run recorded none.
        ``RunCorruptError`` for a record that is not a breakdown."""
        found = None
        for record in self.records("memory"):
            at = record.get("step")
            if step is not None and isinstance(at, int) and at > step:
                break
            found = record
        if found is None:
            return None
        try:
            return MemoryBreakdown.from_record(found)
        except ValueError as exc:
            raise RunCorruptError(f"{self.path / STREAMS['memory'].file}: {exc}") from None

    def events(self) -> list[dict[str, object]]:
        """events.jsonl as a list of dicts, oldest first."""
        return self.records("events")

    @property
    def status(self) -> str:
        """``running``, ``closed``, ``degraded`` (closed, something failed), ``killed`` (its
        writer died without closing) or ``unknown`` (written from another host, silent for a
        while); see :mod:`nbmonitor.runs.status`."""
        try:
            meta = read_meta(self.path)
        except (RunNotFoundError, RunCorruptError):
            meta = self.meta
        return run_status(meta, [self.file(s) for s in STREAMS])

    def tail(self) -> Tail:
        """A :class:`~nbmonitor.runs.tail.Tail` that starts where this run's reads ended
        (streams not read yet start at their beginning)."""
        from nbmonitor.runs.tail import Tail

        return Tail(self.path, offsets=self.offsets)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory written by nbmonitor (exported as ``nbmonitor.open``).

    Raises RunNotFoundError (a RunDirError and a FileNotFoundError) when ``path`` is not a run.
    """
    return Run(path)


__all__ = ["Run", "open_run", "read_meta"]
