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
import os
import pathlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from nbmonitor.errors import RunDirError

FORMAT_VERSION = 1
META = "meta.json"
# The sidecar folder: ``<SIDECAR>/<stream>/<seq>.npz``. Named in meta.json so that a run
# written without one (format 1 before the re-cut) is read from its JSON Lines alone.
SIDECAR = "columns"

Encoding = Literal["columns", "records"]


@dataclass(frozen=True, slots=True)
class Stream:
    """One stream of a run: its file, and how its records read back.

    ``columns``: numeric records (``step``, ``time``, metrics) read as float64 columns, union of
    keys in first-seen order, NaN where a record lacks a key; mirrored in the sidecar.
    ``records``: free-form objects (events) read back as a list of dicts, never in the sidecar.
    """

    name: str
    file: str
    encoding: Encoding

    @property
    def sidecar(self) -> bool:
        return self.encoding == "columns"


STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        Stream("steps", "steps.jsonl", "columns"),
        Stream("system", "system.jsonl", "columns"),
        Stream("events", "events.jsonl", "records"),
        Stream("layers", "layers.jsonl", "columns"),
        Stream("spans", "spans.jsonl", "records"),
        Stream("memory", "memory.jsonl", "records"),
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
    "status": '"closed" or "degraded" (something failed; see errors), written at close',
    "errors": "what failed inside nbmonitor, written at close",
    "backend": '{"name": ..., "devices": [...]}',
}

# Folder names stay portable (no separators, spaces or shell-special characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RunNotFoundError(RunDirError, FileNotFoundError):
    """No run at the path given (missing, a file, or a folder without meta.json)."""


class RunCorruptError(RunDirError, ValueError):
    """A record file with an unparsable line before its last one: real corruption."""


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
_ENCODER = json.JSONEncoder(allow_nan=True, separators=(",", ":"), default=json_default)


def encode_lines(records: Iterable[Mapping[str, object]]) -> bytes:
    """Records as JSON Lines bytes, one line each, every line ending in ``\\n``."""
    enc = _ENCODER.encode
    return "".join(enc(r if type(r) is dict else dict(r)) + "\n" for r in records).encode()


def write_json_atomic(path: pathlib.Path, obj: object) -> None:
    """Write ``obj`` as pretty JSON via a temporary file and ``os.replace``: a reader never
    sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(obj, allow_nan=True, indent=2, default=json_default)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def stream_file(meta: dict[str, object], stream: Stream) -> str:
    """The file name meta.json gives for ``stream`` (older runs name them; default otherwise)."""
    files = meta.get("files")
    name = files.get(stream.name) if isinstance(files, dict) else None
    return name if isinstance(name, str) and "/" not in name else stream.file


__all__ = [
    "FILES",
    "FORMAT_VERSION",
    "META",
    "META_FIELDS",
    "SIDECAR",
    "STREAMS",
    "RunCorruptError",
    "RunDirError",
    "RunNotFoundError",
    "Stream",
    "encode_lines",
    "json_default",
    "run_stem",
    "sanitize_name",
    "stream_file",
    "write_json_atomic",
]
