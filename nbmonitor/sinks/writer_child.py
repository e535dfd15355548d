"""The run log's writer process, the child's end (``python -m nbmonitor.sinks.writer_child``):
write what the parent (``writer.py``'s ``WriterProcess``) sends until ``close`` or the end of its
input. Its own module because it is made of the run log (``RunLogSink``), which imports the
parent's end: one way, no import cycle.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys

from nbmonitor.sinks.base import Batch
from nbmonitor.sinks.runlog import RunLogSink
from nbmonitor.sinks.writer import HEADER, MAX_MESSAGE, _problem, dumps, loads


def _read_exactly(fd: int, n: int) -> bytes | None:
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None  # the parent is gone (a message cut short is dropped)
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _read(fd: int) -> tuple[object, ...] | None:
    head = _read_exactly(fd, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_MESSAGE:
        return None
    data = _read_exactly(fd, size)
    if data is None:
        return None
    try:
        message = loads(data)
    except Exception as exc:  # refused (a class it does not load): said to the parent
        return ("refused", _problem(exc))
    return message if isinstance(message, tuple) else None


def _send(fd: int, message: object) -> None:
    data = dumps(message)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def main() -> None:
    """The child: write what the parent sends until ``close`` or the end of its input."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd_in, fd_out = sys.stdin.fileno(), sys.stdout.fileno()
    _send(fd_out, ("ready",))
    opened = _read(fd_in)
    if opened is None or opened[0] != "open":
        return
    _, path, meta, seqs = opened
    assert isinstance(path, str) and isinstance(meta, dict) and isinstance(seqs, dict)
    sink = RunLogSink(pathlib.Path(path), meta, seqs=seqs)
    problems: list[BaseException] = []
    while True:
        message = _read(fd_in)
        if message is None:
            sink.close()
            return
        kind = message[0]
        if kind == "refused":
            assert isinstance(message[1], BaseException)
            problems.append(message[1])
        elif kind == "write":
            streams = message[1]
            assert isinstance(streams, dict)
            try:
                sink.write(Batch(streams))
            except Exception as exc:
                problems.append(_problem(exc))
        elif kind == "flush":
            try:
                sink.flush()
            except Exception as exc:
                problems.append(_problem(exc))
            ends, clean = sink.written()
            _send(fd_out, ("ack", message[1], ends, clean, problems))
            problems = []
        elif kind == "close":
            sink.close()
            ends, clean = sink.written()
            said = problems + [_problem(e) for e in sink.close_errors]
            _send(fd_out, ("closed", ends, clean, said, sink.lost_rows))
            return


if __name__ == "__main__":
    main()
