"""Reading a run directory: ``open_run(path)`` gives a :class:`Run` whose ``history()``,
``system()``, ``layers()`` and ``events()`` read the files as they are now.

A numeric stream is read from its columnar sidecar (whole chunks, no text parsing) and then
from its JSON Lines past the last chunk; a run without a sidecar (written before it existed,
or killed before its first chunk) is read from the JSON Lines alone, to the same result.
Works while the run is still being written: a torn last line is a write in progress and is
left for later; a line that does not parse, is too long or holds a value of the wrong type is
skipped with a :class:`~nbmonitor.runs.format.RunDataWarning` naming the file, the line and
what is wrong, and the other records are returned.
"""

from __future__ import annotations

import os
import pathlib
import warnings
from typing import TYPE_CHECKING, Any

from nbmonitor.health.alert import Alert
from nbmonitor.health.explain import Explanation, explain
from nbmonitor.memory import MemoryBreakdown
from nbmonitor.runs.decode import (
    CHECKS,
    BadLine,
    Columns,
    LineSplitter,
    Record,
    concat_columns,
    decode_lines,
    to_columns,
    warn_bad,
)
from nbmonitor.runs.files import RunFolder, parse_json, read_fd, read_meta
from nbmonitor.runs.format import (
    STREAMS,
    RunCorruptError,
    RunDataWarning,
    RunDirError,
    RunUnreadableError,
    RunUnsafeError,
    Stream,
    check_name,
    stream_file,
)
from nbmonitor.runs.sidecar import read_chunks
from nbmonitor.runs.status import run_status

if TYPE_CHECKING:
    from nbmonitor.runs.tail import Tail

# Text is read in pieces of this size: the records of one piece are made columns before the
# next is read, so a long text-only run never holds all its text (or all its dicts) at once.
PIECE_BYTES = 16 << 20


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


def read_text(
    folder: RunFolder,
    stream: Stream,
    parts: list[str],
    start: int,
    first_line: int,
    into_columns: bool,
) -> tuple[list[Columns] | list[Record], int]:
    """The records of a stream's JSON Lines from byte ``start`` (line ``first_line``), with the
    reading contract's bounds; (columns blocks or records, the offset after the last whole
    line). Bad lines are skipped with a RunDataWarning naming them."""
    out: list[Any] = []
    bad_all: list[BadLine] = []
    where = folder.where(parts)
    try:
        with folder.opened(parts) as fd:
            size = os.fstat(fd).st_size
            end = min(size, stream.max_bytes)
            if size > stream.max_bytes:
                warnings.warn(
                    RunDataWarning(
                        f"nbmonitor: {where} is larger than the reader's bound for "
                        f"{stream.name} ({stream.max_bytes >> 20} MiB); the rest is not read."
                    ),
                    stacklevel=3,
                )
            split = LineSplitter(stream.max_line, first_line, start)
            at = start
            while at < end:
                piece = read_fd(fd, at, min(PIECE_BYTES, end - at), where)
                if not piece:
                    break
                at += len(piece)
                whole, line, bad = split.feed(piece)
                bad_all += bad
                decoded = decode_lines(whole, first_line=line, check=CHECKS.get(stream.name))
                bad_all += decoded.bad
                if into_columns:
                    if decoded.records:
                        out.append(to_columns(decoded.records))
                else:
                    out += decoded.records
    except FileNotFoundError:
        return out, start
    except (RunUnsafeError, RunUnreadableError) as exc:
        # The stream cannot be read at all: the run's other streams still can.
        warnings.warn(RunDataWarning(f"{exc} The {stream.name} stream is skipped."), stacklevel=3)
        return out, start
    # A bad line that ends the file is a write cut short (docs/file-format.md, "the torn-line
    # rule"), not damage: skipped without a word, as a line with no newline yet is.
    bad_all.sort()
    if bad_all and not split.rest and at >= size and bad_all[-1].line == split.line - 1:
        bad_all.pop()
    if bad_all:
        warn_bad(where, bad_all)
    return out, split.offset


class Run:
    """A run directory on disk, read on demand; works while the run is still being written.

    ``meta`` is meta.json as it was when the run was opened; ``status`` reads it again.
    ``offsets`` holds, per stream read so far, the byte offset its last read ended at (where
    :meth:`tail` picks up). Every file is read by the reading contract (docs/file-format.md,
    "Reading a run folder you did not write").
    """

    path: pathlib.Path
    meta: dict[str, Any]
    offsets: dict[str, int]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = run_path(path)
        self.meta = read_meta(self.path)
        self.offsets = {}
        self.folder = RunFolder(self.path)

    def file(self, stream: str) -> pathlib.Path:
        """The JSON Lines file of ``stream`` (one of :data:`~nbmonitor.runs.format.STREAMS`);
        RunUnsafeError when meta.json names one that is not a plain name in the folder."""
        return self.path / stream_file(self.meta, STREAMS[stream])

    def _parts(self, stream: Stream) -> list[str]:
        return [stream_file(self.meta, stream)]

    def sidecar_parts(self, stream: str) -> list[str] | None:
        """The sidecar folder of ``stream`` inside the run, or None (none, or meta.json names
        one that leaves the folder: then it is ignored and the text read)."""
        name = self.meta.get("sidecar")
        if not (STREAMS[stream].sidecar and isinstance(name, str)):
            return None
        try:
            return [check_name(name, "meta.json sidecar"), stream]
        except RunUnsafeError:
            return None

    def _size(self, parts: list[str]) -> int:
        try:
            return self.folder.size(parts)
        except (FileNotFoundError, RunUnsafeError, RunUnreadableError):
            return 0  # read_text says what is wrong with it

    def columns(self, stream: str) -> Columns:
        """A numeric stream as float64 columns (union of keys in first-seen order, NaN where a
        record lacks a key; keys in few rows held sparse, see
        :class:`~nbmonitor.runs.decode.Columns`); empty if it has no records."""
        s = STREAMS[stream]
        parts = self._parts(s)
        size = self._size(parts)
        blocks: list[Columns] = []
        start = 0
        sidecar = self.sidecar_parts(stream)
        if sidecar is not None and size:
            blocks, start = read_chunks(self.folder, sidecar, parts, size)
        rows_before = sum(b.rows for b in blocks)
        text, self.offsets[stream] = read_text(
            self.folder, s, parts, start, rows_before + 1, into_columns=True
        )
        return concat_columns([*blocks, *text])

    def records(self, stream: str) -> list[Record]:
        """A stream as a list of dicts, oldest first (the JSON Lines, parsed and checked)."""
        s = STREAMS[stream]
        records, self.offsets[stream] = read_text(
            self.folder, s, self._parts(s), 0, 1, into_columns=False
        )
        return records  # type: ignore[return-value]

    def history(self) -> Columns:
        """steps.jsonl as float64 columns (union of keys, NaN where missing); empty if none.

        A ``nbmonitor.runs.Columns`` mapping: keys in few rows are held sparse until looked
        up. Damaged lines are skipped with a ``RunDataWarning`` (docs/file-format.md, "Reading
        a run folder you did not write")."""
        return self.columns("steps")

    def system(self) -> Columns:
        """system.jsonl as float64 columns, like :meth:`history`."""
        return self.columns("system")

    def layers(self) -> Columns:
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

    def events(self) -> list[Alert]:
        """The alerts of events.jsonl, oldest first: ``nbmonitor.health.Alert`` objects, as a
        live ``mon.events()`` returns (``alert["rule"]`` still reads a field as the dicts this
        returned before). Each record is typed and bounded (``Alert.from_record``); one with
        no rule is skipped with a RunDataWarning. ``records("events")`` gives the raw dicts."""
        alerts: list[Alert] = []
        skipped = 0
        for record in self.records("events"):
            alert = Alert.from_record(record)
            if alert is None:
                skipped += 1
            else:
                alerts.append(alert)
        if skipped:
            where = self.path / STREAMS["events"].file
            warnings.warn(
                RunDataWarning(f"nbmonitor: {where}: {skipped} record(s) with no rule skipped."),
                stacklevel=2,
            )
        return alerts

    def explain(self, which: Alert | int | str | None = None) -> Explanation:
        """What an alert of this run says, as data (``mon.explain`` on the live run): its
        cause, evidence, place and fix. ``which``: an alert, an index into ``events()``, a
        rule name (its newest alert) or None (the newest alert)."""
        return explain(self.events(), which, "run.explain")

    @property
    def status(self) -> str:
        """``running``, ``closed``, ``degraded`` (closed, something failed), ``killed`` (its
        writer died without closing) or ``unknown`` (written from another host, silent for a
        while); see :mod:`nbmonitor.runs.status`."""
        try:
            meta = read_meta(self.path)
        except RunDirError:
            meta = self.meta
        files = []
        for s in STREAMS.values():
            try:
                files.append(self.path / stream_file(meta, s))
            except RunUnsafeError:
                continue
        return run_status(meta, files)

    def tail(self) -> Tail:
        """A :class:`~nbmonitor.runs.tail.Tail` that starts where this run's reads ended
        (streams not read yet start at their beginning)."""
        from nbmonitor.runs.tail import Tail

        return Tail(self.path, offsets=self.offsets)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory written by nbmonitor (exported as ``nbmonitor.open``).

    Raises RunNotFoundError (a RunDirError and a FileNotFoundError) when ``path`` is not a run,
    RunCorruptError when its meta.json cannot be read as one.
    """
    return Run(path)


__all__ = ["Run", "open_run", "parse_json", "read_meta", "read_text"]
