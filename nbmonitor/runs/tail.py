"""Following a run that another process is writing: each ``poll()`` returns the records that
arrived since the last one, reading only the new bytes of each file.

Per stream the tail keeps the file open, a byte offset, the file's identity (device, inode)
and the torn rest of the last read (a line whose newline has not arrived yet). A poll reads the
open file from its offset to its current size (at most MAX_POLL_BYTES), then looks at the path
again: a file replaced there (renamed away and made anew, as log rotation or a restarted writer
does) is read from its start once the old one is drained, so nothing is lost; a file that
shrank in place was rewritten and is read again from its start (with a warning). Files that
do not exist yet (a run that has not started, a stream with no records) are simply empty.
meta.json is read again when it changes, *before* the streams, so that the poll that first
sees the run closed also returns its last records (the writer closes its files before it marks
the run closed).

Every file is opened by the reading contract (``files.py``): regular files inside the run
folder only, bounded reads. A line longer than the stream's bound is skipped as it streams by
(never held whole), a complete line that does not parse or holds a wrongly typed field is
skipped; both are counted in ``bad_lines`` and named in a RunDataWarning, or given to the
``report`` callable instead (a terminal app shows them in its own place; catching warnings
would be process-wide and not thread-safe). ``ended`` tells a writer that died without
closing. Any thread; one Tail is not shared between threads;
``close()`` releases its files.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nbmonitor.runs.decode import (
    CHECKS,
    LineSplitter,
    Record,
    Report,
    decode_lines,
    loads_line,
    warn_bad,
)
from nbmonitor.runs.files import RunFolder, read_fd, read_meta
from nbmonitor.runs.format import (
    MAX_META_BYTES,
    META,
    STREAMS,
    RunDataWarning,
    RunDirError,
    RunNotFoundError,
    stream_file,
)
from nbmonitor.runs.status import CLOSED_STATUSES, STALE_S, run_status

# The most one poll reads of one file: a tail started at byte 0 of a long run catches up over
# several polls instead of holding the whole file (and all its records) at once.
MAX_POLL_BYTES = 32 << 20


class _Cursor:
    __slots__ = ("fd", "identity", "split")

    def __init__(self, max_line: int, offset: int) -> None:
        self.fd = -1
        self.identity: tuple[int, int] | None = None
        self.split = LineSplitter(max_line, 1, offset)

    @property
    def offset(self) -> int:
        return self.split.offset

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


class Tail:
    """Incremental reader of the run at ``path``.

    ``offsets`` (per stream, bytes already consumed) lets a tail start where a full read ended
    (:meth:`nbmonitor.runs.Run.tail` does this); streams not named start at byte 0. ``streams``
    limits which streams are followed (default: all of :data:`~nbmonitor.runs.format.STREAMS`).
    The folder may not exist yet; its parent must (a mistyped path fails at once).
    ``stale_s``: how long a run written from another host may stay silent before ``ended``.
    ``report``: called with each problem's one-line message (a bad or too long line, a file
    replaced or rewritten) instead of a RunDataWarning being raised.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        offsets: Mapping[str, int] | None = None,
        streams: Iterable[str] | None = None,
        stale_s: float = STALE_S,
        report: Report | None = None,
    ) -> None:
        self.path = pathlib.Path(path)
        self.report = report
        if self.path.exists() and not self.path.is_dir():
            raise RunNotFoundError(
                f"nbmonitor: cannot tail '{self.path}' (not a folder); pass the folder of one run."
            )
        parent = self.path.absolute().parent
        if not self.path.exists() and not parent.is_dir():
            raise RunNotFoundError(
                f"nbmonitor: cannot tail '{self.path}': neither it nor its parent folder "
                f"'{parent}' exists; check the path."
            )
        names = list(STREAMS) if streams is None else list(streams)
        unknown = [n for n in names if n not in STREAMS]
        if unknown:
            raise ValueError(
                f"nbmonitor: unknown stream(s) {unknown}; choose from {sorted(STREAMS)}."
            )
        start = dict(offsets or {})
        self._cursors = {n: _Cursor(STREAMS[n].max_line, int(start.get(n, 0))) for n in names}
        self._folder = RunFolder(self.path)
        self.meta: dict[str, Any] = {}
        self._meta_stamp: tuple[int, int, int] | None = None
        self.bad_lines = 0
        self.stale_s = stale_s
        self._grew_at = time.monotonic()
        self._quiet = False  # the last poll found no new bytes

    @property
    def offsets(self) -> dict[str, int]:
        """Per stream, the byte offset up to which whole lines have been returned."""
        return {n: c.offset for n, c in self._cursors.items()}

    @property
    def closed(self) -> bool:
        """True once meta.json says the run was closed (its last records are then on disk)."""
        return self.meta.get("status") in CLOSED_STATUSES or bool(self.meta.get("end_time"))

    @property
    def ended(self) -> str | None:
        """Why the run will get no more records although it was never closed, or None: its
        writer's process is gone (same host), or nothing was written for ``stale_s`` seconds
        (a writer on another host). Read after a poll that found nothing new."""
        if self.closed or not self.meta or not self._quiet:
            return None
        pid, host = self.meta.get("pid"), self.meta.get("host")
        valid = isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 2**31
        if valid and host == socket.gethostname():
            gone = run_status(self.meta, []) == "killed"
            return f"its writer (pid {pid}) is gone" if gone else None
        silent = time.monotonic() - self._grew_at
        if silent > self.stale_s:
            return f"nothing was written for {silent:.0f} s"
        return None

    def _poll_meta(self) -> None:
        try:
            ident = self._folder.identity([META])
        except (OSError, RunDirError):
            return
        stamp = (ident[1], ident[2], int(ident[3] * 1e9))
        if stamp == self._meta_stamp:
            return
        try:
            meta = loads_line(self._folder.read_whole([META], MAX_META_BYTES))
        except (OSError, ValueError, RunDirError):
            return  # replaced atomically, so this is a race with a new file: next poll
        if isinstance(meta, dict):
            self.meta, self._meta_stamp = meta, stamp

    def _open(self, name: str, cursor: _Cursor, parts: list[str]) -> bool:
        """Open (or re-open) the stream's file; False when there is none (yet)."""
        try:
            fd = self._folder.open_fd(parts)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if cursor.fd >= 0 and ident == cursor.identity:
            os.close(fd)
            return True
        if cursor.fd >= 0:  # replaced: the old file is drained, the new one read from 0
            if cursor.split.rest:
                self._warn(name, f"{self._folder.where(parts)} was replaced with a torn line")
                self.bad_lines += 1
            cursor.close()
            cursor.split = LineSplitter(cursor.split.max_line, 1, 0)
        cursor.fd, cursor.identity = fd, ident
        return True

    def _poll_stream(self, name: str, cursor: _Cursor) -> list[Record]:
        try:
            parts = [stream_file(self.meta, STREAMS[name])]
        except RunDirError as exc:
            self._warn(name, str(exc))
            return []
        out: list[Record] = []
        for _ in range(2):  # the file as open, then the file now at the path if it changed
            if cursor.fd < 0 and not self._open(name, cursor, parts):
                return out
            out += self._drain(name, cursor, parts)
            before = cursor.identity
            try:
                if not self._open(name, cursor, parts):
                    return out  # deleted: keep what we have open, a new file is read later
            except RunDirError as exc:
                self._warn(name, str(exc))
                return out
            if cursor.identity == before:
                return out
        return out

    def _drain(self, name: str, cursor: _Cursor, parts: list[str]) -> list[Record]:
        where = self._folder.where(parts)
        split = cursor.split
        size = os.fstat(cursor.fd).st_size
        read_to = split.offset + len(split.rest)
        if size < read_to:
            self._warn(name, f"{where} shrank ({size} bytes, {read_to} already read); "
                             "it was rewritten, read again from its start")  # fmt: skip
            cursor.split = split = LineSplitter(split.max_line, 1, 0)
            read_to = 0
        if size == read_to:
            return []
        # Up to the size seen (and at most MAX_POLL_BYTES): the rest waits for next poll.
        new = read_fd(cursor.fd, read_to, min(size - read_to, MAX_POLL_BYTES), where)
        if new:
            self._grew_at = time.monotonic()
            self._quiet = False
        whole, line, bad = split.feed(new)
        decoded = decode_lines(whole, first_line=line, check=CHECKS.get(name))
        bad += decoded.bad
        if bad:
            self.bad_lines += len(bad)
            warn_bad(where, sorted(bad), report=self.report)
        return decoded.records

    def _warn(self, name: str, message: str) -> None:
        message = f"nbmonitor: {message.removeprefix('nbmonitor: ').rstrip('.')}."
        if self.report is not None:
            self.report(message)
        else:
            warnings.warn(RunDataWarning(message), stacklevel=4)

    def poll(self) -> dict[str, list[Record]]:
        """New records per stream since the last poll (streams with none are left out)."""
        self._poll_meta()
        self._quiet = True
        out: dict[str, list[Record]] = {}
        for name, cursor in self._cursors.items():
            records = self._poll_stream(name, cursor)
            if records:
                out[name] = records
        return out

    def close(self) -> None:
        """Release the open files (the tail can poll again: it re-opens them)."""
        for cursor in self._cursors.values():
            cursor.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"Tail({str(self.path)!r}, {state}, offsets={self.offsets})"


def wait_for_run(
    tail: Tail, wait: float, say: Callable[[str], None] | None = None, every: float = 0.25
) -> None:
    """Return once the run ``tail`` follows has its meta.json, and that meta.json reads (by
    the reading contract: a FIFO, a symlink or damaged JSON there raises its RunDirError at
    once, instead of a follow that never sees the run). RunNotFoundError after ``wait``
    seconds. ``say`` is told once that it waits ("waiting for RUN to appear")."""
    meta = tail.path / META
    if not os.path.lexists(meta):
        if say is not None:
            say(f"nbmonitor: waiting for {tail.path} to appear (up to {wait:g} s)")
        deadline = time.monotonic() + wait
        while not os.path.lexists(meta):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RunNotFoundError(
                    f"nbmonitor: no run appeared at '{tail.path}' within {wait:g} s; check the "
                    "path, or wait longer (wait=, --wait)."
                )
            time.sleep(min(every, left))
    read_meta(tail.path)


__all__ = ["MAX_POLL_BYTES", "Tail", "wait_for_run"]
