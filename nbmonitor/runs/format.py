"""The run directory format, declared once for the writer (sinks/runlog.py) and the readers.

A run is a folder: ``meta.json`` plus one append-only JSON Lines file per *stream*, and (since
the re-cut) a columnar sidecar that makes long runs open fast. Every stream is one row of
:data:`STREAMS`: adding a stream (spans, per-rank steps) is one line here, and the writer, the
reader, the tail and the catalog pick it up. docs/file-format.md is the reference.

Stdlib and numpy only: no torch, no widget libraries.
"""

from __future__ import annotations

import datetime as _dt
import json
import pathlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from nbmonitor._atomic import write_atomic  # re-exported: every file here not appended to
from nbmonitor.errors import RunDirError

FORMAT_VERSION = 1
META = "meta.json"
# The sidecar folder: ``<SIDECAR>/<stream>/<seq>.npz``. Named in meta.json so that a run
# written without one (format 1 before the re-cut) is read from its JSON Lines alone.
SIDECAR = "columns"

Encoding = Literal["columns", "records"]


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream of a run: its file, how its records read back, and the reader's bounds.

    ``columns``: numeric records (``step``, ``time``, metrics) read as float64 columns, union of
    keys in first-seen order, NaN where a record lacks a key; mirrored in the sidecar.
    ``records``: free-form objects (events) read back as a list of dicts, never in the sidecar.
    ``max_line``: a longer line is skipped with a warning (never held whole in memory);
    ``max_bytes``: past this size the rest of the file is not read (with a warning).
    """

    name: str
    file: str
    encoding: Encoding
    max_line: int = 1 << 20
    max_bytes: int = 16 << 30

    @property
    def sidecar(self) -> bool:
        return self.encoding == "columns"


STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        Stream("steps", "steps.jsonl", "columns", max_line=4 << 20),
        Stream("system", "system.jsonl", "columns", max_line=1 << 20),
        Stream("events", "events.jsonl", "records", max_line=1 << 20, max_bytes=1 << 30),
        # One record holds every layer's norms: a model with tens of thousands of parameters.
        Stream("layers", "layers.jsonl", "columns", max_line=64 << 20),
        Stream("spans", "spans.jsonl", "records", max_line=64 << 10, max_bytes=4 << 30),
        Stream("memory", "memory.jsonl", "records", max_line=16 << 20, max_bytes=4 << 30),
    )
}
FILES = {name: s.file for name, s in STREAMS.items()}

# meta.json fields the run log and the readers rely on (the monitor adds many more: model,
# optimizer, versions, attach arguments). Readers ignore fields they do not know.
META_FIELDS: dict[str, str] = {
    "format_version": "int: FORMAT_VERSION; bumped on any incompatible change",
    "files": "{stream: file name}, written by the run log",
    "sidecar": "folder of the columnar sidecar (absent: none, read the JSON Lines)",
    "host": "hostname of the writing process (with pid: tells a killed writer)",
    "pid": "process id of the writing process",
    "start_time": "ISO 8601 UTC, when the run started",
    "start_timestamp": "Unix seconds, when the run started",
    "end_time": "ISO 8601 UTC, written at close",
    "steps": "optimizer steps completed, written at close",
    "status": '"closed", "degraded" (something failed; see errors) or "stopped" (a stop was '
    "asked for), written at close",
    "errors": "what failed inside nbmonitor, written at close",
    "backend": '{"name": ..., "devices": [...]}',
    "phases": '{"device_every": n}: the phases of the steps divisible by n were timed on the '
    "device (CUDA events), the others on the host clock; 0 or absent: all on the host clock",
}

# The reading contract's bounds besides the streams' own (docs/file-format.md, "Reading a run
# folder you did not write"). meta.json holds the model's parameter table: large, not huge.
MAX_META_BYTES = 32 << 20
# JSON nesting a reader follows; the writer never nests deeper than a few levels.
MAX_DEPTH = 64
# A name read from meta.json (a stream's file, the sidecar folder) is one path component.
MAX_NAME = 255

# Folder names stay portable (no separators, spaces or shell-special characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RunNotFoundError(RunDirError, FileNotFoundError):
    """No run at the path given (missing, a file, or a folder without meta.json)."""


class RunCorruptError(RunDirError, ValueError):
    """A run whose files cannot be read as a run: meta.json damaged, a file that is not a
    regular file inside the folder, a file past its size bound."""


class RunUnsafeError(RunCorruptError):
    """A file of the run that the reading contract refuses to open: a FIFO, device, socket or
    folder where a file belongs, a symlink, or a name from meta.json that leaves the folder."""


class RunUnreadableError(RunDirError, PermissionError):
    """A file of the run that exists but cannot be read (permissions, an I/O error)."""


class RunDataWarning(UserWarning):
    """A part of a run skipped while the rest was read: the message names the file, the line
    and what is wrong with it."""


def check_name(name: object, what: str) -> str:
    """``name`` if it is one plain path component (not empty, ``.``, ``..``, no separator or
    NUL or control character, at most MAX_NAME bytes); RunUnsafeError naming ``what`` else."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(c in name for c in "/\\\0")
        or not name.isprintable()
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME
    ):
        shown = repr(name)[:80]
        raise RunUnsafeError(
            f"nbmonitor: {what} {shown} is not a plain file name inside the run folder; "
            "refusing to follow it."
        )
    return name


def sanitize_name(name: str | None) -> str:
    """The ``<name>`` part of a run folder: unsafe characters become ``-``; ``run`` if empty."""
    return _UNSAFE.sub("-", name or "run").strip("-.") or "run"


def run_stem(name: str | None, now: _dt.datetime | None = None) -> str:
    """``<YYYYmmdd-HHMMSS>-<name>`` in local time; the writer appends ``-2``, ``-3`` if taken."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{sanitize_name(name)}"


def json_default(obj: object) -> object:
    """numpy scalars become numbers; anything else in metadata becomes its ``str``.

    Metadata carries whatever the caller found (dtypes, devices, optimizer objects); writing
    ``str(obj)`` keeps the run going instead of losing the whole meta.json to one odd value.
    """
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, pathlib.PurePath):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


# allow_nan=True writes NaN / Infinity / -Infinity, which Python's json reads back exactly;
# NaN is data here (a diverged loss), not an error. One encoder for every line: json.dumps()
# with options builds a new one per call, a third of the cost of a step's line.
JSON_ENCODER = json.JSONEncoder(allow_nan=True, separators=(",", ":"), default=json_default)


def encode_lines(records: Iterable[Mapping[str, object]]) -> bytes:
    """Records as JSON Lines bytes, one line each, every line ending in ``\\n``."""
    enc = JSON_ENCODER.encode
    return "".join(enc(r if type(r) is dict else dict(r)) + "\n" for r in records).encode()


def write_json_atomic(path: pathlib.Path, obj: object) -> None:
    """Write ``obj`` as pretty JSON atomically (:func:`write_atomic`)."""
    text = json.dumps(obj, allow_nan=True, indent=2, default=json_default)
    write_atomic(path, (text + "\n").encode("utf-8", "surrogatepass"))


def stream_file(meta: dict[str, object], stream: Stream) -> str:
    """The file name meta.json gives for ``stream`` (older runs name them; default otherwise).
    A name that is not one plain component inside the folder raises RunUnsafeError."""
    files = meta.get("files")
    name = files.get(stream.name) if isinstance(files, dict) else None
    return stream.file if name is None else check_name(name, f"meta.json files.{stream.name}")


__all__ = [
    "FILES",
    "FORMAT_VERSION",
    "JSON_ENCODER",
    "MAX_DEPTH",
    "MAX_META_BYTES",
    "MAX_NAME",
    "META",
    "META_FIELDS",
    "SIDECAR",
    "STREAMS",
    "RunCorruptError",
    "RunDataWarning",
    "RunDirError",
    "RunNotFoundError",
    "RunUnreadableError",
    "RunUnsafeError",
    "Stream",
    "check_name",
    "encode_lines",
    "json_default",
    "run_stem",
    "sanitize_name",
    "stream_file",
    "write_atomic",
    "write_json_atomic",
]
