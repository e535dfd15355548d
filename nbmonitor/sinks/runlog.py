"""The run log: the run directory written as one Sink (format in nbmonitor/runs/format.py).

The store in memory is bounded and decimated; this is the full-resolution record, and the one
that outlives the kernel. Crash safety comes from the shape of the writes, not from fsync:

* each stream's rows of a tick are one ``write()`` of whole lines, and ``flush()`` (once per
  sampler tick) hands them to the OS, so a killed *process* loses only the last interval;
* a write cut short leaves at most one torn last line, which readers skip;
* ``meta.json`` and each sidecar chunk are replaced atomically (temp file + ``os.replace``).

A power cut can still lose what the OS had not written back; we do not fsync every tick
because a monitor must not slow the training it watches. See docs/file-format.md.

Numeric streams are also buffered as columns and cut into sidecar chunks at a flush once
``CHUNK_VALUES`` values have gathered, and at close (nbmonitor/runs/sidecar.py): long runs
then open without parsing their text. A sidecar that fails to write is given up for that
stream (the error is raised once); readers then parse the JSON Lines past its last chunk.
Sampler thread (``close`` and ``update_meta`` may come from the main thread: one lock).

**The disk comes back.** The record files are written unbuffered (each tick's rows of a stream
are one ``write()`` system call anyway), so the writer knows exactly which bytes the OS took.
What a failing write (a full disk, a quota, a file-size limit) did not take waits in memory, in
order, up to ``BACKLOG_BYTES`` in all, and is written ahead of the next rows once writing works
again; a write cut short is completed, never repeated, so no line is torn or doubled. Rows that
would take the backlog past its bound are dropped and counted (``lost_rows``). The first
failure of a spell, and the first loss, raise (the caller reports them); the ticks between
retry quietly.

**The text is made in a writer process** (``offload=True``, a live run's: ``sinks/writer.py``).
The first write of at least ``OFFLOAD_VALUES`` values, once ``OFFLOAD_AFTER_VALUES`` were
written in process (a short run never starts it), starts it; once it is ready (the rows are
written here meanwhile) this process pickles each batch's rows to it, and the child encodes
and writes them with an in-process ``RunLogSink`` of its own (the same bytes, sidecar chunks
and disk-full handling), so a busy run's float text no longer holds the training process's
GIL. A scheduled tick's ``flush`` asks the child to flush without waiting for its answer;
``settle`` (``mon.flush()``, through ``FanOut.settle``) waits for it, and ``close`` for the
child's end. What the child has not confirmed on disk is kept here; a
child that dies, or takes or answers nothing within ``WRITER_TIMEOUT_S``, is stopped and this
process writes from the first byte the files lack, in process from then on, and says so once.
Without a sidecar after that (the readers parse the text past its last chunk).
"""

from __future__ import annotations

import collections
import collections.abc
import contextlib
import errno
import os
import pathlib
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

from nbmonitor.runs.column_rows import ColumnRows, row_parts
from nbmonitor.runs.decode import Columns
from nbmonitor.runs.encode import LineEncoder
from nbmonitor.runs.format import (
    FILES,
    FORMAT_VERSION,
    META,
    SIDECAR,
    STREAMS,
    RunDirError,
    encode_lines,
    run_stem,
    write_json_atomic,
)
from nbmonitor.runs.layout import claim_rank_dir, job_meta, write_job_meta
from nbmonitor.runs.sidecar import ChunkBuffer, write_chunk
from nbmonitor.sinks.base import Batch, Rows
from nbmonitor.sinks.writer import AVAILABLE, WriterGone, WriterProcess

# Rows that could not be written yet wait in memory up to this many bytes (a few minutes of a
# busy run at ~100 kB per tick: long enough for a cleanup, bounded for a disk that stays full).
BACKLOG_BYTES = 64 * 2**20
# Problems of one write kept to be raised at the next writes (one is raised per write).
UNSAID_MAX = 4
# Rows encoded between two pauses (when the run log has one: a live run's).
SLICE_ROWS = 32
# A write of at least this many values (rows x keys, summed over streams) starts the writer
# process of a run log made with ``offload=True`` (below it the text costs under a millisecond a
# tick, less than the process's start).
OFFLOAD_VALUES = 1024
# ... once this run log has written this many values in process: a short run (a few hundred
# steps) never pays the process's start, which competes with its first steps for the cores.
OFFLOAD_AFTER_VALUES = 100_000
# The writer process must take a message, or answer a flush or the close, within this long, or
# it is stopped and this process writes in its place.
WRITER_TIMEOUT_S = 10.0


def _values(streams: object) -> int:
    """Values (rows x keys of each stream's first row) in a batch's streams."""
    assert isinstance(streams, collections.abc.Iterable)
    total = 0
    for rows in streams:
        if rows:
            first = row_parts(rows)[0]  # rows held as columns: no row made to count its keys
            width = len(first.columns) if isinstance(first, ColumnRows) else len(first[0])
            total += len(rows) * width
    return total


def _dir_id(path: pathlib.Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _claim(root: pathlib.Path, stem: str) -> pathlib.Path:
    """``root/<stem>``, or ``<stem>-2``, ``-3``... the first that ``mkdir`` makes."""
    path, suffix = root / stem, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            suffix += 1
            path = root / f"{stem}-{suffix}"


def _error(run_dir: object, exc: OSError) -> RunDirError:
    reason = exc.strerror or type(exc).__name__
    return RunDirError(
        f"nbmonitor: cannot write to run_dir '{run_dir}' ({reason}); "
        "pass run_dir= a writable folder."
    )


class RunLogSink:
    """Writer of one run directory. Use :meth:`create`."""

    name = "runlog"

    def __init__(
        self,
        path: pathlib.Path,
        meta: dict[str, object],
        pause: Callable[[], None] | None = None,
        *,
        offload: bool = False,
        seqs: Mapping[str, int] | None = None,
    ) -> None:
        """Open the record files of an already-made run directory for append. ``pause`` is
        called between two slices of ``SLICE_ROWS`` rows being encoded (the live sampler lets
        the training thread take the GIL there). ``offload``: encode in a writer process once
        the rows are many (module docstring). ``seqs``: the streams whose sidecar goes on,
        each with its next chunk's number (the writer process's; default: every sidecar
        stream from chunk 0)."""
        self._path = path
        self._meta = meta
        self._pause = pause
        self._lock = threading.Lock()
        self._closed = False
        self.close_errors: list[BaseException] = []  # what close() swallowed
        self._files: dict[str, IO[bytes]] = {}
        # Per stream, what the OS has not taken yet: the writes' own bytes, oldest first, never
        # joined or copied (memory is what waits, not a multiple of it).
        self._backlog: dict[str, collections.deque[bytes]] = {}
        self._backlog_bytes = 0
        self.lost_rows = 0  # dropped because the backlog was full
        self._unsaid: list[Exception] = []  # problems of a write raised at the next ones
        self._failing = False  # in a spell of failed writes (reported once)
        self._last_error: OSError = OSError()
        self._losing = False  # dropping rows in this spell (reported once)
        self._open_files()
        self._dir_id = _dir_id(path)  # to see the directory deleted (or replaced) mid-run
        self._dir_lost = False  # deleted and not made again yet (reported once)
        self._chunks = {
            name: ChunkBuffer(self._files[name].tell())
            for name, s in STREAMS.items()
            if s.sidecar and meta.get("sidecar") == SIDECAR and (seqs is None or name in seqs)
        }
        for name, buf in self._chunks.items():
            buf.seq = seqs[name] if seqs is not None else 0
        # The writer process (None: encoding here), what was sent to it since it last said all
        # of it was on disk, and the files' sizes then (None: unknown).
        self._offload = offload and AVAILABLE
        self._values_here = 0  # values written in process while the writer may still start
        self._writer: WriterProcess | None = None
        self._starting: WriterProcess | None = None  # started, not ready yet
        # Batches sent (their number, rows, pickled size) the child has not confirmed on disk,
        # and for each flush it has not answered yet, the number of batches sent before it.
        self._sent: collections.deque[tuple[int, Batch, int]] = collections.deque()
        self._sent_count = 0
        self._sent_bytes = 0
        self._marks: collections.deque[int] = collections.deque()
        self._took_over = False  # what it left unsaid is said at the next flush too
        self._confirmed: dict[str, int] | None = None
        # Numeric streams' rows are encoded by key-set templates (their keys recur every row);
        # free-form streams (events, spans, memory) by the json encoder.
        self._encoders = {name: LineEncoder() for name, s in STREAMS.items() if s.sidecar}

    def _open_files(self) -> None:
        files: dict[str, IO[bytes]] = {}
        try:
            for stream, fname in FILES.items():
                # Unbuffered: see "The disk comes back" above.
                files[stream] = open(self._path / fname, "ab", buffering=0)  # noqa: SIM115
        except OSError:
            for f in files.values():
                f.close()
            raise
        self._files = files

    def _check_dir(self) -> None:
        """Under the lock. A run directory deleted mid-run (by hand, by a cleanup job) would
        take every later row into unlinked files without a word: make it again, with meta.json
        and new record files, and raise once to say so."""
        try:
            if _dir_id(self._path) == self._dir_id:
                return
        except OSError:
            pass
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._chunks.clear()  # the sidecar went with it; readers parse the new text
        try:
            self._path.mkdir(parents=True, exist_ok=True)
            self._meta["recreated"] = True
            write_json_atomic(self._path / META, self._meta)
            self._open_files()
            self._dir_id = _dir_id(self._path)
        except OSError as exc:
            if self._dir_lost:
                return  # reported; tried again every flush
            self._dir_lost = True
            raise RunDirError(
                f"nbmonitor: the run directory {self._path} was deleted while the run was "
                f"writing to it, and it cannot be made again ({exc.strerror or exc}); "
                "rows wait in memory until it can"
            ) from None
        self._dir_lost = False
        raise RunDirError(
            f"nbmonitor: the run directory {self._path} was deleted while the run was writing "
            "to it; it was made again and rows from now on are written there (earlier ones "
            "went with it)"
        )

    @classmethod
    def create(
        cls,
        run_dir: str | os.PathLike[str],
        name: str | None,
        meta: Mapping[str, object],
        *,
        job_id: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        pause: Callable[[], None] | None = None,
        offload: bool = False,
    ) -> RunLogSink:
        """Make ``run_dir/<YYYYmmdd-HHMMSS>-<name>/`` (``-2``, ``-3``... if taken), write
        meta.json and open the record files for append.

        With ``job_id`` (one rank of a distributed job) the run is ``rank<rank>/`` inside the
        job folder all ranks share (``nbmonitor/runs/layout.py``: no race for names).
        Raises RunDirError with a one-line hint if any of that fails. ``offload``: encode in
        a writer process once the rows are many (module docstring).
        """
        root = pathlib.Path(run_dir)
        stem = run_stem(name)
        try:
            root.mkdir(parents=True, exist_ok=True)
            if job_id is not None:
                job, path = claim_rank_dir(root, name, job_id, rank)
                write_job_meta(job, job_meta(name, job_id, world_size))
            else:
                path = _claim(root, stem)
            full: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid()}
            full.update(meta)
            full.update(format_version=FORMAT_VERSION, files=dict(FILES), sidecar=SIDECAR)
            write_json_atomic(path / META, full)
            return cls(path, full, pause, offload=offload)
        except OSError as exc:
            raise _error(run_dir, exc) from None

    @property
    def offloaded(self) -> bool:
        """Whether a writer process was started for this run log (starting or taking it)."""
        return self._starting is not None or self._writer is not None

    @property
    def path(self) -> pathlib.Path:
        """The run directory."""
        return self._path

    @property
    def meta(self) -> dict[str, object]:
        """A copy of what meta.json holds."""
        with self._lock:
            return dict(self._meta)

    # -- Sink ------------------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        """Append each stream's rows (one line each, one ``write()`` per stream)."""
        unknown = [s for s in batch.streams if s not in self._files]
        if unknown:
            raise ValueError(f"nbmonitor: run log has no stream(s) {unknown}")
        if self._starting is not None:
            self._hand_over(self._starting)
        if self._writer is not None and self._send(batch):
            return
        values = _values(batch.streams.values()) if self._offload else 0
        self._values_here += values
        if values >= OFFLOAD_VALUES and self._values_here >= OFFLOAD_AFTER_VALUES:
            self._offload = False  # tried once
            try:
                self._write_here(batch)  # the problems of this batch are said first
            finally:
                self._start_writer()
            return
        self._write_here(batch)

    def _write_here(self, batch: Batch) -> None:
        # Problems not yet said (one is raised per write) come first.
        problems, self._unsaid = self._unsaid, []
        for stream, rows in batch.streams.items():
            if rows:
                # Every stream is written even when one fails; the first new problem is raised,
                # the next ones at the next writes (rows starting to be dropped in the same
                # write as the disk filling up must still be said).
                try:
                    self._append(stream, rows)
                except Exception as exc:
                    problems.append(exc)
        if problems:
            self._unsaid = problems[1:UNSAID_MAX]
            raise problems[0]

    def _append(self, stream: str, rows: Rows) -> None:
        # Encode before taking the lock and before touching the file, so a value that cannot
        # be encoded fails the batch without leaving half of it on disk.
        data, cols = self._encode(stream, rows)
        with self._lock:
            if self._closed:
                raise ValueError(f"nbmonitor: run log {self._path} is closed")
            if self._backlog_bytes + len(data) > BACKLOG_BYTES:
                self._retry()
            if self._backlog_bytes + len(data) > BACKLOG_BYTES:
                self.lost_rows += len(rows)
                self._chunks.pop(stream, None)
                if not self._losing:
                    self._losing = True
                    raise OSError(
                        errno.ENOSPC,
                        f"nbmonitor: the run log cannot be written and {BACKLOG_BYTES >> 20} MiB "
                        "of rows already wait in memory; newer rows are dropped until it can",
                    )
                return
            if not self._write(stream, data):
                self._chunks.pop(stream, None)  # the sidecar's byte spans would lie
                return self._failed()
            buf = self._chunks.get(stream)
            if buf is not None and cols is not None:
                buf.add(cols, len(data))

    def _encode(self, stream: str, rows: Rows) -> tuple[bytes, Columns | None]:
        """The rows' JSON Lines, and their columns when ``stream`` has a sidecar. Encoding is
        the costly part of a write and holds the GIL: in slices of ``SLICE_ROWS`` rows, with
        the pause between, so the training thread does not wait for a whole tick's rows."""
        encoder = self._encoders.get(stream)
        if encoder is not None:
            return encoder.encode(
                rows, columns=stream in self._chunks, pause=self._pause, every=SLICE_ROWS
            )
        pause, size = self._pause, SLICE_ROWS
        if pause is None or len(rows) <= size:
            return encode_lines(rows), None
        parts = []
        for start in range(0, len(rows), size):
            if start:
                pause()
            parts.append(encode_lines(rows[start : start + size]))
        return b"".join(parts), None

    def _write(self, stream: str, data: bytes) -> bool:
        """Write ``data`` after what ``stream`` has waiting; what the OS does not take waits.
        True when nothing is left waiting."""
        waiting = self._backlog.pop(stream, None)
        if waiting is None:
            waiting = collections.deque()
        else:
            self._backlog_bytes -= sum(map(len, waiting))  # counted again if it still waits
        if data:
            waiting.append(data)
        file, done = self._files[stream], 0
        try:
            while waiting:
                chunk = waiting[0]
                done = 0
                with memoryview(chunk) as view:
                    while done < len(chunk):
                        # One call for the whole chunk; the rest through the view after a
                        # short write.
                        n = file.write(view[done:] if done else chunk)
                        if not n:
                            raise OSError(errno.EIO, "write() took no bytes")
                        done += n
                waiting.popleft()
        except (OSError, ValueError) as exc:  # ValueError: its directory went, file closed
            self._last_error = exc if isinstance(exc, OSError) else OSError(errno.EIO, str(exc))
            if done:
                waiting[0] = waiting[0][done:]  # a write cut short: its rest only
            self._backlog[stream] = waiting
            self._backlog_bytes += sum(map(len, waiting))
            return False
        return True

    def _retry(self) -> bool:
        """Write what waits, stream by stream; True when nothing waits any more."""
        for stream in list(self._backlog):
            if not self._write(stream, b""):
                return False
        self._failing = self._losing = False
        return True

    def _failed(self) -> None:
        if self._failing:
            return  # reported when the spell began; the backlog is retried every tick
        self._failing = True
        exc = self._last_error
        raise OSError(
            exc.errno,
            f"nbmonitor: writing the run log failed ({exc.strerror or exc}); rows wait in "
            f"memory (up to {BACKLOG_BYTES >> 20} MiB) and are written once it works again",
        ) from exc

    # -- the writer process ----------------------------------------------------------------

    def _start_writer(self) -> None:
        """Start the writer process; it takes over once ready (``_hand_over``). If it cannot
        start, this process goes on writing (said once)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._starting = WriterProcess()
            except OSError as exc:
                raise OSError(
                    f"nbmonitor: the run log's writer process cannot start ({exc}); the run "
                    "log is written in this process"
                ) from None

    def _hand_over(self, writer: WriterProcess) -> None:
        """Once the child is ready: cut the sidecar chunks here (the child's start where these
        end) and hand it the run folder. A child that died before is said once."""
        with self._lock:
            if self._closed or self._backlog:
                return  # a disk that fails: the backlog is retried here
            try:
                if not writer.ready():
                    return
                for f in self._files.values():
                    f.flush()
                for stream in [s for s, b in self._chunks.items() if b.rows]:
                    self._cut(stream)
                writer.open(self._path, self._meta, {s: b.seq for s, b in self._chunks.items()})
            except WriterGone as exc:
                self._starting = None
                code = writer.kill()
                raise OSError(
                    f"nbmonitor: the run log's writer process did not start ({exc}; exit code "
                    f"{code}); the run log is written in this process"
                ) from None
            self._starting = None
            self._writer, self._confirmed = writer, self._sizes()
            self._chunks.clear()  # the child's from now on

    def _sizes(self) -> dict[str, int]:
        """The record files' sizes now (-1: unreadable)."""
        sizes = {}
        for stream, fname in FILES.items():
            try:
                sizes[stream] = os.stat(self._path / fname).st_size
            except OSError:
                sizes[stream] = -1
        return sizes

    def written(self) -> tuple[dict[str, int], bool]:
        """The record files' sizes, and whether nothing waits in the backlog (the writer
        process's answer to a flush)."""
        with self._lock:
            return self._sizes(), not self._backlog

    def _send(self, batch: Batch) -> bool:
        """Hand ``batch`` to the writer process; False when there is none any more (the rows
        are then written here)."""
        with self._lock:
            if self._closed:
                raise ValueError(f"nbmonitor: run log {self._path} is closed")
            writer = self._writer
            if writer is None:
                return False
            try:
                size = writer.send(("write", dict(batch.streams)), WRITER_TIMEOUT_S)
            except WriterGone as exc:
                self._take_over(exc)
                return False
            self._sent_count += 1
            self._sent.append((self._sent_count, batch, size))
            self._sent_bytes += size
            while self._sent_bytes > BACKLOG_BYTES:  # a child that never confirms: bounded
                self._sent_bytes -= self._sent.popleft()[2]
                self._confirmed = None
            return True

    def _flush_writer(self, writer: WriterProcess) -> None:
        """Under the lock: the answers that came are taken, and the child is asked to flush;
        a scheduled tick does not wait for it (``settle`` does)."""
        try:
            self._answers(writer, None)
            writer.send(("flush", self._sent_count), WRITER_TIMEOUT_S)
            self._marks.append(self._sent_count)
        except WriterGone as exc:
            self._take_over(exc)
            self._flush_here()
        if self._unsaid:
            problems, self._unsaid = self._unsaid, []
            self._unsaid = problems[1:UNSAID_MAX]
            raise problems[0]

    def _answers(self, writer: WriterProcess, timeout: float | None) -> None:
        """Under the lock: take the child's answers to flushes, those that came (``timeout``
        None) or until all have come, ``timeout`` seconds at most. What a clean answer
        confirms is let go. WriterGone if it died or does not answer in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._marks:
            if deadline is None:
                answer = writer.poll()
                if answer is None:
                    return
            else:
                answer = writer.answer(max(0.0, deadline - time.monotonic()))
            if answer[0] != "ack" or len(answer) != 5:
                raise WriterGone(f"it answered {answer[0]!r} to a flush")
            _, mark, ends, clean, said = answer
            if not (isinstance(mark, int) and isinstance(ends, dict) and isinstance(said, list)):
                raise WriterGone("its answer to a flush did not read")
            self._marks.popleft()
            if clean:
                while self._sent and self._sent[0][0] <= mark:
                    self._sent_bytes -= self._sent.popleft()[2]
                self._confirmed = ends
            self._unsaid.extend(said)

    @property
    def what(self) -> str:
        return "run log writing"

    def begin_close(self, final_meta: Mapping[str, object]) -> None:
        """Part of ``Background``: the run log closes in ``close``."""

    def hung_for(self) -> float | None:
        """Part of ``Background``: a run log that hangs is its worker's (``_engine/isolated``)."""
        return None

    def settle(self, timeout: float) -> bool:
        """Wait, ``timeout`` seconds at most, until the writer process has answered every
        flush (``mon.flush()``: the rows on disk when it returns); True when nothing waits.
        A child that died meanwhile is replaced here (said at the next write). Never raises."""
        with self._lock:
            writer = self._writer
            if writer is None or self._closed:
                return True
            try:
                self._answers(writer, timeout)
            except WriterGone as exc:
                self._take_over(exc)
            except Exception as exc:
                self._unsaid.append(exc)
            return not self._marks

    def _take_over(self, why: WriterGone) -> None:
        """Under the lock: stop the writer process and write what it did not confirm, from
        the first byte the files lack (its encoding gives the same bytes), then encode here.
        The problem is said at the next write or flush."""
        writer, self._writer = self._writer, None
        assert writer is not None
        code = writer.kill()
        self._took_over = True
        batches = [b for _, b, _ in self._sent]
        self._sent.clear()
        self._marks.clear()
        self._sent_bytes = 0
        self._unsaid.append(
            RuntimeError(
                f"nbmonitor: the run log's writer process (pid {writer.pid}) stopped "
                f"({why}; exit code {code}); the run log is written in this process from now on"
            )
        )
        confirmed, self._confirmed = self._confirmed, None
        try:
            self._check_dir()
        except RunDirError as exc:  # made again: what it held is gone
            self._unsaid.append(exc)
            confirmed = None
        sizes = self._sizes()
        for stream in FILES:
            rows = [b.streams[stream] for b in batches if b.streams.get(stream)]
            # Bytes of these rows the child wrote before it stopped.
            done = 0
            if confirmed is not None and confirmed.get(stream, -1) >= 0 and sizes[stream] >= 0:
                done = max(0, sizes[stream] - confirmed[stream])
            for part in rows:
                try:
                    data, _ = self._encode(stream, part)
                except Exception as exc:  # the child failed on these rows too
                    self._unsaid.append(exc)
                    continue
                if done >= len(data):
                    done -= len(data)
                    continue
                if not self._write(stream, data[done:]):
                    self._failing = True
                    self._unsaid.append(self._last_error)
                done = 0

    def flush(self) -> None:
        """Hand buffered records to the OS (once per sampler tick; no fsync, see the module
        docstring), and cut the sidecar chunks that are due."""
        with self._lock:
            if self._closed:
                return
            if self._writer is not None:
                return self._flush_writer(self._writer)
            self._flush_here()
            if self._took_over:  # the writer process's end, seen in settle(): said here
                self._took_over = False
                problems, self._unsaid = self._unsaid, []
                self._unsaid = problems[1:UNSAID_MAX]
                if problems:
                    raise problems[0]

    def _flush_here(self) -> None:
        """Under the lock: ``flush`` in this process."""
        self._check_dir()
        if self._backlog and not self._retry():
            return self._failed()
        for f in self._files.values():
            f.flush()
        for stream in [s for s, b in self._chunks.items() if b.due]:
            self._cut(stream)

    def _cut(self, stream: str) -> None:
        """Write the buffered rows of ``stream`` as its next chunk (files already flushed)."""
        buf = self._chunks[stream]
        try:
            if self._files[stream].tell() != buf.end:
                raise RunDirError(f"nbmonitor: {stream} file and its sidecar disagree")
            blocks, span = buf.take()
            write_chunk(self._path / SIDECAR / stream, buf.seq, blocks, span)
            buf.seq += 1
        except BaseException:
            del self._chunks[stream]  # readers parse the text past the last good chunk
            raise

    def close(self, final_meta: Mapping[str, object] | None = None) -> None:
        """Flush, write the last sidecar chunks, close the files, then merge ``final_meta``
        into meta.json (so a reader that sees the run closed finds all its records).
        Idempotent; never raises (what failed is kept in ``close_errors``)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._starting is not None:  # never handed the run: its input ends
                    self._starting.wait(WRITER_TIMEOUT_S)
                    self._starting = None
                if self._writer is not None:
                    self._close_writer(self._writer)
                if self._backlog and not self._retry():
                    self.close_errors.append(
                        OSError(
                            f"nbmonitor: {self._backlog_bytes} bytes of rows could not be "
                            f"written to the run log ({self._last_error})"
                        )
                    )
                if self.lost_rows:
                    self.close_errors.append(
                        OSError(f"nbmonitor: {self.lost_rows} rows were dropped (disk full)")
                    )
                for f in self._files.values():
                    try:
                        f.flush()
                    except Exception as exc:  # OSError, or ValueError on a closed file
                        self.close_errors.append(exc)
                for stream in [s for s, b in self._chunks.items() if b.rows]:
                    try:
                        self._cut(stream)
                    except Exception as exc:
                        self.close_errors.append(exc)
                for f in self._files.values():
                    try:
                        f.close()
                    except Exception as exc:  # keep closing the others
                        self.close_errors.append(exc)
        if final_meta:
            try:
                self.update_meta(**final_meta)
            except Exception as exc:
                self.close_errors.append(exc)

    def _close_writer(self, writer: WriterProcess) -> None:
        """Under the lock: the child writes its last rows and chunks and exits, within one
        ``WRITER_TIMEOUT_S`` in all; one that does not (or answers nonsense) is stopped and
        its rows are written here. Never raises."""
        deadline = time.monotonic() + WRITER_TIMEOUT_S

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        try:
            writer.send(("close",), left())
            self._answers(writer, left())  # the flushes' first
            answer = writer.answer(left())
            if answer[0] != "closed" or len(answer) != 5:
                raise WriterGone(f"it answered {answer[0]!r} to close")
            _, _, _, problems, lost = answer
            if not isinstance(problems, list) or not isinstance(lost, int):
                raise WriterGone("its answer to close did not read")
        except Exception as exc:
            gone = exc if isinstance(exc, WriterGone) else WriterGone(repr(exc))
            self._take_over(gone)
            self.close_errors.extend(self._unsaid)
            self._unsaid = []
            return
        self._writer = None
        self._sent.clear()
        self.close_errors.extend([*self._unsaid, *problems])
        self._unsaid = []
        self.lost_rows += lost
        writer.wait(left())

    def update_meta(self, **fields: object) -> None:
        """Merge ``fields`` into meta.json, rewritten atomically. Allowed after close:
        meta.json is not one of the append-only files."""
        with self._lock:
            self._meta.update(fields)
            write_json_atomic(self._path / META, self._meta)

    # -- the run log's API before the Sink protocol (the monitor still calls these) ---------

    def write_steps(self, rows: Rows) -> None:
        """Append per-step rows to steps.jsonl."""
        self.write(Batch({"steps": rows}))

    def write_samples(self, rows: Rows) -> None:
        """Append system samples to system.jsonl."""
        self.write(Batch({"system": rows}))

    def write_events(self, events: Rows) -> None:
        """Append events (alerts, errors, lifecycle) to events.jsonl."""
        self.write(Batch({"events": events}))

    def write_layers(self, rows: Rows) -> None:
        """Append per-layer rows (``step``, ``param_norm/<layer>``, ``update_ratio/<layer>``)."""
        self.write(Batch({"layers": rows}))

    def __repr__(self) -> str:
        return f"RunLogSink({str(self._path)!r}{', closed' if self._closed else ''})"


__all__ = ["RunLogSink"]
