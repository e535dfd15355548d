"""The run directory on disk: metadata plus append-only, crash-safe JSON Lines records.

The store in memory is bounded and decimated; this is the full-resolution record, and the one
that outlives the kernel. Crash safety comes from the shape of the writes, not from fsync:

* each batch of records is one ``write()`` of whole lines, and ``flush()`` (once per sampler
  tick) hands it to the OS, so a killed *process* loses only what it had not flushed yet;
* a write cut short leaves at most one torn last line, which the reader skips;
* ``meta.json`` is replaced atomically (temp file + ``os.replace``), never half-written.

A power cut can still lose what the OS had not written back; we do not fsync every tick
because a monitor must not slow the training it watches. See docs/file-format.md.

Stdlib and numpy only: no torch, no widget libraries.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import pathlib
import re
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from nbmonitor.errors import RunDirError

FloatArray = npt.NDArray[np.float64]

FORMAT_VERSION = 1
META = "meta.json"
STEPS = "steps.jsonl"
SYSTEM = "system.jsonl"
EVENTS = "events.jsonl"
LAYERS = "layers.jsonl"
FILES = {"steps": STEPS, "system": SYSTEM, "events": EVENTS, "layers": LAYERS}

# Folder names stay portable (no separators, spaces or shell-special characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _json_default(obj: object) -> object:
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
_ENCODER = json.JSONEncoder(allow_nan=True, separators=(",", ":"), default=_json_default)


def _dumps(obj: object) -> str:
    return _ENCODER.encode(obj)


def _write_json_atomic(path: pathlib.Path, obj: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(obj, allow_nan=True, indent=2, sort_keys=False, default=_json_default)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def _error(run_dir: object, exc: OSError) -> RunDirError:
    reason = exc.strerror or type(exc).__name__
    return RunDirError(
        f"nbmonitor: cannot write to run_dir '{run_dir}' ({reason}); "
        "pass run_dir= a writable folder."
    )


class RunLog:
    """Writer for one run directory; only the sampler thread writes, ``close`` may come from
    the main thread, so writes and close share a lock."""

    path: pathlib.Path

    def __init__(self, path: pathlib.Path, meta: dict[str, object]) -> None:
        """Use :meth:`create`; this opens the record files of an already-made directory."""
        self.path = path
        self._meta = meta
        self._lock = threading.Lock()
        self._closed = False
        self._files: dict[str, IO[bytes]] = {}
        try:
            for kind, fname in FILES.items():
                self._files[kind] = open(path / fname, "ab")  # noqa: SIM115 - closed in close()
        except OSError:
            for f in self._files.values():
                f.close()
            raise

    @classmethod
    def create(
        cls, run_dir: str | os.PathLike[str], name: str | None, meta: Mapping[str, object]
    ) -> RunLog:
        """Make ``run_dir/<YYYYmmdd-HHMMSS>-<name>/`` (``-2``, ``-3``... if taken), write
        meta.json and open the record files for append.

        Raises RunDirError with a one-line hint if any of that fails.
        """
        root = pathlib.Path(run_dir)
        label = _UNSAFE.sub("-", name or "run").strip("-.") or "run"
        stem = f"{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{label}"
        try:
            root.mkdir(parents=True, exist_ok=True)
            path = root / stem
            suffix = 1
            while True:
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    suffix += 1
                    path = root / f"{stem}-{suffix}"
            full = {**meta, "format_version": FORMAT_VERSION, "files": dict(FILES)}
            _write_json_atomic(path / META, full)
            return cls(path, full)
        except OSError as exc:
            raise _error(run_dir, exc) from None

    @property
    def meta(self) -> dict[str, object]:
        """A copy of what meta.json holds."""
        with self._lock:
            return dict(self._meta)

    def write_steps(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Append per-step rows to steps.jsonl (one line each, one write for the batch)."""
        self._write("steps", rows)

    def write_samples(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Append system samples to system.jsonl."""
        self._write("system", rows)

    def write_events(self, events: Sequence[Mapping[str, object]]) -> None:
        """Append events (alerts, errors, lifecycle) to events.jsonl."""
        self._write("events", events)

    def write_layers(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Append per-layer rows (``step``, ``param_norm/<layer>``, ``update_ratio/<layer>``)."""
        self._write("layers", rows)

    def _write(self, kind: str, records: Sequence[Mapping[str, object]]) -> None:
        if not records:
            return
        # Encode before taking the lock and before touching the file, so a value that cannot
        # be encoded fails the batch without leaving half of it on disk.
        data = "".join(_dumps(r if type(r) is dict else dict(r)) + "\n" for r in records).encode(
            "utf-8"
        )
        with self._lock:
            if self._closed:
                raise ValueError(f"nbmonitor: run log {self.path} is closed")
            self._files[kind].write(data)

    def update_meta(self, **fields: object) -> None:
        """Merge ``fields`` into meta.json (e.g. end_time, status at close), rewritten
        atomically. Allowed after close: meta.json is not one of the append-only files."""
        with self._lock:
            self._meta.update(fields)
            _write_json_atomic(self.path / META, self._meta)

    def flush(self) -> None:
        """Hand buffered records to the OS (called once per sampler tick; no fsync, see the
        module docstring)."""
        with self._lock:
            if self._closed:
                return
            for f in self._files.values():
                f.flush()

    def close(self) -> None:
        """Flush and close the record files; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            errors: list[OSError] = []
            for f in self._files.values():
                try:
                    f.close()
                except OSError as exc:  # keep closing the others
                    errors.append(exc)
            if errors:
                raise errors[0]

    def __repr__(self) -> str:
        return f"RunLog({str(self.path)!r}{', closed' if self._closed else ''})"


def _read_records(path: pathlib.Path) -> list[dict[str, Any]]:
    """Every complete record of a JSON Lines file; a torn or unparsable last line is skipped.

    A final line without its newline is a write still in progress (or cut by a kill); a bad
    line *before* the last one is real corruption and raises, rather than silently dropping
    data from the middle of a run.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    lines.pop()  # the part after the last newline: b"" or a torn record
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return []
    try:
        # One parse for the whole file is several times faster than one per line.
        records = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        records = []
        for i, line in enumerate(lines):
            try:
                records.append(json.loads(line))
            except ValueError:
                if i == len(lines) - 1:
                    break
                raise ValueError(
                    f"nbmonitor: {path} line {i + 1} is not valid JSON; the file is corrupt."
                ) from None
    return [r for r in records if isinstance(r, dict)]


def _columns(records: list[dict[str, Any]]) -> dict[str, FloatArray]:
    """Records as float64 columns: union of keys in first-seen order, NaN where missing."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r))
    nan = math.nan
    # None (JSON null) also reads as NaN, so files written by other tools load too.
    return {k: np.array([r.get(k, nan) for r in records], dtype=np.float64) for k in keys}


class Run:
    """Reader for a run directory; works while the run is still being written."""

    path: pathlib.Path
    meta: dict[str, object]

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        meta_path = self.path / META
        try:
            text = meta_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(
                f"nbmonitor: no run at '{self.path}' ({META} not found); pass the folder of "
                "one run, e.g. runs/20240101-120000-run."
            ) from None
        except NotADirectoryError:
            raise FileNotFoundError(
                f"nbmonitor: no run at '{self.path}' (not a folder); pass the folder of one run."
            ) from None
        meta = json.loads(text)
        self.meta = meta if isinstance(meta, dict) else {"meta": meta}

    def _file(self, kind: str) -> pathlib.Path:
        files = self.meta.get("files")
        name = files.get(kind) if isinstance(files, dict) else None
        return self.path / (name if isinstance(name, str) else FILES[kind])

    def history(self) -> dict[str, FloatArray]:
        """steps.jsonl as float64 columns (union of keys, NaN where missing); ``{}`` if none."""
        return _columns(_read_records(self._file("steps")))

    def system(self) -> dict[str, FloatArray]:
        """system.jsonl as float64 columns, like :meth:`history`."""
        return _columns(_read_records(self._file("system")))

    def events(self) -> list[dict[str, object]]:
        """events.jsonl as a list of dicts, oldest first."""
        return _read_records(self._file("events"))

    def layers(self) -> dict[str, FloatArray]:
        """layers.jsonl (written every ``layer_every`` steps) as float64 columns."""
        path = self._file("layers")
        return _columns(_read_records(path)) if path.exists() else {}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory written by nbmonitor (exported as ``nbmonitor.open``)."""
    return Run(path)
