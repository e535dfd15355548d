"""Following a run that another process is writing: each ``poll()`` returns the records that
arrived since the last one, reading only the new bytes of each file.

Per stream the tail keeps a byte offset and the torn rest of the last read (a line whose
newline has not arrived yet); a poll ``stat``s each file, reads from its offset to its current
size, decodes the whole lines and keeps the rest for next time. Files that do not exist yet
(a run that has not started, a stream that has no records) are simply empty. meta.json is read
again when it changes, *before* the streams, so that the poll that first sees the run closed
also returns its last records (the writer closes its files before it marks the run closed).

A complete line that does not parse is skipped and counted in ``bad_lines`` (in a file still
being written one cannot tell the last line, so the reader's "corrupt before the last line"
rule does not apply). Any thread; one Tail is not shared between threads.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nbmonitor.runs.decode import Record, decode_lines, split_complete
from nbmonitor.runs.format import META, STREAMS, RunDirError, RunNotFoundError, stream_file

# The most one poll reads of one file: a tail started at byte 0 of a long run catches up over
# several polls instead of holding the whole file (and all its records) at once.
MAX_POLL_BYTES = 32 << 20


@dataclass
class _Cursor:
    offset: int = 0  # bytes consumed: the end of the last whole line
    rest: bytes = b""  # bytes read past ``offset``: a torn line waiting for its newline


class Tail:
    """Incremental reader of the run at ``path``.

    ``offsets`` (per stream, bytes already consumed) lets a tail start where a full read ended
    (:meth:`nbmonitor.runs.Run.tail` does this); streams not named start at byte 0. ``streams``
    limits which streams are followed (default: all of :data:`~nbmonitor.runs.format.STREAMS`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        offsets: Mapping[str, int] | None = None,
        streams: Iterable[str] | None = None,
    ) -> None:
        self.path = pathlib.Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RunNotFoundError(
                f"nbmonitor: cannot tail '{self.path}' (not a folder); pass the folder of one run."
            )
        names = list(STREAMS) if streams is None else list(streams)
        unknown = [n for n in names if n not in STREAMS]
        if unknown:
            raise ValueError(
                f"nbmonitor: unknown stream(s) {unknown}; choose from {sorted(STREAMS)}."
            )
        start = dict(offsets or {})
        self._cursors = {n: _Cursor(offset=int(start.get(n, 0))) for n in names}
        self.meta: dict[str, Any] = {}
        self._meta_stamp: tuple[int, int] | None = None
        self.bad_lines = 0

    @property
    def offsets(self) -> dict[str, int]:
        """Per stream, the byte offset up to which whole lines have been returned."""
        return {n: c.offset for n, c in self._cursors.items()}

    @property
    def closed(self) -> bool:
        """True once meta.json says the run was closed (its last records are then on disk)."""
        return self.meta.get("status") in ("closed", "degraded") or bool(self.meta.get("end_time"))

    def _poll_meta(self) -> None:
        try:
            st = (self.path / META).stat()
        except OSError:
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._meta_stamp:
            return
        try:
            meta = json.loads((self.path / META).read_bytes())
        except (OSError, ValueError):
            return  # replaced atomically, so this is a race with a new file: next poll
        if isinstance(meta, dict):
            self.meta, self._meta_stamp = meta, stamp

    def _poll_stream(self, name: str, cursor: _Cursor) -> list[Record]:
        path = self.path / stream_file(self.meta, STREAMS[name])
        try:
            size = path.stat().st_size
        except OSError:
            return []
        read_to = cursor.offset + len(cursor.rest)
        if size < read_to:
            raise RunDirError(
                f"nbmonitor: {path} shrank ({size} bytes, {read_to} already read); it was "
                "rewritten, not appended to: open the run again."
            )
        if size == read_to:
            return []
        with open(path, "rb") as f:
            f.seek(read_to)
            # Up to the size seen (and at most MAX_POLL_BYTES): the rest waits for next poll.
            new = f.read(min(size - read_to, MAX_POLL_BYTES))
        whole, cursor.rest = split_complete(cursor.rest + new)
        cursor.offset += len(whole)
        decoded = decode_lines(whole)
        self.bad_lines += len(decoded.bad)
        return decoded.records

    def poll(self) -> dict[str, list[Record]]:
        """New records per stream since the last poll (streams with none are left out)."""
        self._poll_meta()
        out: dict[str, list[Record]] = {}
        for name, cursor in self._cursors.items():
            records = self._poll_stream(name, cursor)
            if records:
                out[name] = records
        return out

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"Tail({str(self.path)!r}, {state}, offsets={self.offsets})"


__all__ = ["Tail"]
