"""The run log's writer process: a live run's JSON Lines text made outside its GIL.

Formatting a tick's floats as text (``float.__repr__``, the format's bytes) is most of what the
run log costs a busy run, and in the training process it holds the GIL the training thread
needs. So a live run's log (``RunLogSink(offload=True)``), once a tick brings enough values to
be worth it, hands its rows to a child process, pickled (a small fraction of the encoding's
cost), and the child writes them with an ordinary in-process ``RunLogSink``: the same encoder,
hence the same bytes, the same sidecar chunks, the same handling of a full disk.

The child starts in the background and says ``("ready",)`` once it has imported what it
needs; until then the parent goes on writing in process (a child's start, a second or two of a
loaded machine, never holds up a tick's rows). The pipe carries length-prefixed pickles. Then
the parent sends::

    ("open", path, meta, seqs)     # once: the run folder, its meta, each sidecar's next chunk
    ("write", {stream: rows})      # a Batch's streams
    ("flush", n)                   # answered ("ack", n, ends, clean, errors); n: batches before
    ("close",)                     # answered ("closed", ends, clean, errors, lost_rows), then exit

``ends`` are the record files' sizes after the flush and ``clean`` says that nothing waits in
the child's backlog: the parent keeps what it sent until such an answer, so that when the child
dies (or stops answering) it writes the rest itself, from the first byte the files lack
(``RunLogSink._take_over``): rows are neither lost nor doubled. The child ends at ``close``, or
at the end of its input: a training process that is killed loses only what it had not sent.

The child (``writer_child.py``: it is made of the run log, which imports this module) ignores
SIGINT (a Ctrl-C in a terminal reaches the whole process group) and runs in a session of its
own; it imports numpy and ``nbmonitor.runs``, never torch.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

# Pipes that select() can wait on, and a child that reads its stdin as a file descriptor:
# POSIX. Elsewhere the run log encodes in its own process.
AVAILABLE = os.name == "posix"
HEADER = struct.Struct("<Q")
# The largest message either side accepts (a tick's rows are a few MB at most).
MAX_MESSAGE = 1 << 30


class _Pickler(pickle.Pickler):
    """Rows and meta as the child may read them: a subclass of str, float, int, list, tuple
    or dict (``torch.torch_version.TorchVersion``, ``torch.Size``, ``numpy.float64``) goes
    as its base type, whose JSON text is the same (the json module writes a subclass by its
    base's value); so the child never imports what made them (torch). Exact builtins are
    pickled by C without a call here."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, str):
            return str, (str.__str__(obj),)
        if isinstance(obj, float):
            return float, (float.__float__(obj),)
        if isinstance(obj, int) and not isinstance(obj, bool):
            return int, (int.__int__(obj),)
        if isinstance(obj, (list, tuple)):
            return list if isinstance(obj, list) else tuple, (list(obj),)
        if isinstance(obj, dict):
            return dict, (dict(obj),)
        return NotImplemented


def dumps(obj: object) -> bytes:
    """``obj`` pickled for the other side (``_Pickler``)."""
    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


class _Unpickler(pickle.Unpickler):
    """Builtins, numpy and nbmonitor's errors only: a message that would import anything
    else (torch) is refused rather than loading it into the writer."""

    def find_class(self, module: str, name: str) -> object:
        if (
            module in ("builtins", "copyreg", "_codecs", "nbmonitor.errors")
            or module.startswith(("numpy.", "nbmonitor.runs."))
            or module == "numpy"
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the run log's writer does not load {module}.{name}")


def loads(data: bytes) -> object:
    """A message from the other side (``_Unpickler``)."""
    return _Unpickler(io.BytesIO(data)).load()


class WriterGone(Exception):
    """The writer process died, or did not take or answer a message in time."""


def _problem(exc: BaseException) -> BaseException:
    """``exc`` as it can cross the pipe (pickled), else a RuntimeError with its text."""
    try:
        loads(dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


# The pipe to the child holds this much (Linux; else the system's default): a tick or two of a
# busy run, so that a child busy with the last tick does not hold up the next one's send.
PIPE_BYTES = 1 << 20


class WriterProcess:
    """The parent's end: spawn, send, read answers, stop. Not thread-safe (the run log calls
    it under its lock)."""

    def __init__(self) -> None:
        """Start the child (it says ``ready`` when it is). OSError if it cannot be started."""
        root = str(pathlib.Path(__file__).resolve().parents[2])  # holds this nbmonitor
        env = dict(os.environ)
        # The child imports this nbmonitor, whatever the parent's sys.path was made of.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "nbmonitor.sinks.writer_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=root,
            env=env,
            start_new_session=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._out = self._proc.stdin.fileno()
        self._in = self._proc.stdout.fileno()
        os.set_blocking(self._out, False)
        if fcntl is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._out, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._buffer = bytearray()

    def poll(self) -> tuple[object, ...] | None:
        """The child's next answer if it has come (without waiting); WriterGone if it died."""
        message = self._message()
        if message is not None:
            return message
        readable, _, _ = select.select([self._in], [], [], 0)
        if readable:
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise WriterGone("its output ended")
            self._buffer.extend(chunk)
        return self._message()

    def ready(self) -> bool:
        """Whether the child has said it is ready (without waiting); WriterGone if it died."""
        message = self.poll()
        if message is None:
            return False
        if message != ("ready",):
            raise WriterGone(f"it said {message[0]!r} before it was ready")
        return True

    def open(self, path: pathlib.Path, meta: Mapping[str, object], seqs: dict[str, int]) -> None:
        """Hand the child the run folder (this process stops writing it)."""
        self.send(("open", str(path.absolute()), dict(meta), seqs), timeout=10.0)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def send(self, message: object, timeout: float) -> int:
        """Pickle ``message`` and write it to the child; its size in bytes. Pickling errors
        are raised as they are; WriterGone when the child is gone or takes nothing for
        ``timeout`` seconds."""
        data = dumps(message)
        self._write(HEADER.pack(len(data)), timeout)
        self._write(data, timeout)
        return len(data)

    def _write(self, data: bytes, timeout: float) -> None:
        view, deadline = memoryview(data), time.monotonic() + timeout
        while view:
            try:
                view = view[os.write(self._out, view) :]
                continue
            except BlockingIOError:
                pass
            except OSError as exc:  # EPIPE: the child is gone
                raise WriterGone(f"the pipe closed ({exc.strerror or exc})") from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise WriterGone(f"it took nothing for {timeout:g} s")
            select.select([], [self._out], [], min(left, 0.2))
            if self._proc.poll() is not None:
                raise WriterGone(f"it exited with {self._proc.returncode}")

    def answer(self, timeout: float) -> tuple[object, ...]:
        """The child's next answer; WriterGone when none comes within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            message = self._message()
            if message is not None:
                return message
            left = deadline - time.monotonic()
            if left <= 0:
                raise WriterGone(f"it did not answer within {timeout:g} s")
            ready, _, _ = select.select([self._in], [], [], left)
            if ready:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise WriterGone("its output ended")
                self._buffer.extend(chunk)

    def _message(self) -> tuple[object, ...] | None:
        """The next whole message read from the child, if one is."""
        buf = self._buffer
        if len(buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(buf)
        if size > MAX_MESSAGE:
            raise WriterGone(f"it sent a message of {size} bytes")
        if len(buf) < HEADER.size + size:
            return None
        data = bytes(buf[HEADER.size : HEADER.size + size])
        del buf[: HEADER.size + size]
        got = loads(data)
        if not isinstance(got, tuple):
            raise WriterGone(f"it answered {type(got).__name__}")
        return got

    def wait(self, timeout: float) -> int | None:
        """Close our end of its input and wait up to ``timeout`` for it to exit; its exit
        code, or None if it is still running (then killed)."""
        with contextlib.suppress(OSError):
            os.close(self._out)
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return self.kill()
        self._close_fds()
        return code

    def kill(self) -> int | None:
        """Stop it now (it may hold a half-written line: the parent completes it)."""
        with contextlib.suppress(OSError):
            self._proc.kill()
        try:
            code = self._proc.wait(5.0)
        except subprocess.TimeoutExpired:  # unkillable (a disk that hangs): left to the OS
            code = None
        self._close_fds()
        return code

    def _close_fds(self) -> None:
        for f in (self._proc.stdin, self._proc.stdout):
            with contextlib.suppress(OSError):
                if f is not None:
                    f.close()


__all__ = ["AVAILABLE", "WriterGone", "WriterProcess"]
