"""Following every run in a folder at once (``nbmonitor top --runs DIR``): per run its step,
loss, throughput, ETA, status and alerts, and the recent curves of the one selected.

Each run is read by a :class:`~nbmonitor.runs.tail.Tail` of its ``steps`` and ``events``
streams only, started near the end of its files (the last ``TAIL_BYTES``), so following a run
costs the new bytes since the last poll and never a whole file. A run that has closed is read
one last time and then left alone. The folder is listed again every ``rescan_s`` seconds;
runs are ordered newest first by folder name (which begins with the start time) and at most
``max_runs`` are followed. A job folder of several ranks is followed through its first rank.
Any thread; one RunsWatch is not shared between threads.
"""

from __future__ import annotations

import collections
import math
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from nbmonitor.errors import RunDirError
from nbmonitor.runs.files import RunFolder
from nbmonitor.runs.format import META, STREAMS, stream_file
from nbmonitor.runs.layout import LAYOUT, rank_dirs, read_json
from nbmonitor.runs.status import run_status
from nbmonitor.runs.tail import Tail

FloatArray = npt.NDArray[np.float64]

# How far back from the end of a run's files the first read starts: about 2,000 steps of a
# typical run, enough for the curves, whatever the run's length.
TAIL_BYTES = 1 << 20
# How far back from there to look for the start of that line.
_LINE_BYTES = 1 << 16
# The steps of a run kept for its curves (the newest).
KEEP_ROWS = 2000
ALERTS_KEPT = 50
# The step columns kept per run (the curves and the table).
CURVES = ("loss", "grad_norm", "step_time")
KEPT = ("step", "time", *CURVES, "samples_per_s", "tokens_per_s")


@dataclass(frozen=True)
class RunRow:
    """One run as the table shows it (NaN where the run has not said)."""

    name: str
    path: str
    status: str
    step: int
    total_steps: int | None
    loss: float
    samples_per_s: float
    tokens_per_s: float
    step_time: float
    eta_s: float
    alerts: int
    last_alert: str
    kind: str = "run"  # "run", "job" (several ranks) or "devices" (a device watch)
    pid: int | None = None  # the writer's process and host, as meta.json says
    host: str = ""


@dataclass(frozen=True)
class RunDetail:
    """The selected run: its row, its recent steps (``KEPT`` columns, oldest first) and its
    newest alerts (newest last)."""

    row: RunRow
    series: dict[str, FloatArray] = field(default_factory=dict)
    alerts: tuple[dict[str, Any], ...] = ()


def _start_offset(folder: RunFolder, name: str, keep: int) -> int:
    """Where to start reading the run's file ``name`` for its last ``keep`` bytes: the start of
    the line holding byte ``size - keep`` (0 when the file is shorter, absent or refused: the
    tail then says why)."""
    try:
        size = folder.size([name])
        if size <= keep:
            return 0
        back = min(size - keep, _LINE_BYTES)
        before = folder.read([name], size - keep - back, back)
    except (OSError, RunDirError):
        return 0
    cut = before.rfind(b"\n")
    if cut < 0:  # the line starts at the file's start, or is longer than _LINE_BYTES
        return 0 if back == size - keep else size - keep
    return size - keep - back + cut + 1


_NUMBER = (int, float)  # exact types: a bool is not a number here


def _num(value: object) -> float:
    return float(value) if type(value) in _NUMBER else math.nan  # type: ignore[arg-type]


class _Followed:
    """One run being followed: its tail, its recent steps, its alerts."""

    def __init__(self, path: pathlib.Path, name: str, kind: str, tail_bytes: int) -> None:
        self.path, self.name, self.kind = path, name, kind
        meta = read_json(path / META)
        meta = meta if isinstance(meta, dict) else {}
        folder = RunFolder(path)
        offsets = {
            s: _start_offset(folder, stream_file(meta, STREAMS[s]), tail_bytes)
            for s in ("steps", "events")
        }
        # What the tail finds wrong (a torn or bad line, a file rewritten) is shown in the
        # run's row, not printed across the terminal app: told to us, not warned.
        self.tail = Tail(path, offsets=offsets, streams=("steps", "events"), report=self._problem)
        self.rows: collections.deque[tuple[float, ...]] = collections.deque(maxlen=KEEP_ROWS)
        self.last: dict[str, float] = {}
        self.alerts: collections.deque[dict[str, Any]] = collections.deque(maxlen=ALERTS_KEPT)
        self.alert_count = 0
        self.status = "unknown"
        self.done = False  # closed and read to its end
        self.error = ""  # the newest problem the tail reported (the row shows it)

    def poll(self, with_status: bool) -> None:
        if self.done:
            return
        try:
            new = self.tail.poll()
        except (OSError, ValueError) as exc:  # RunDirError is a RuntimeError: see below
            self.error = f"{type(exc).__name__}: {exc}"
            return
        except RuntimeError as exc:  # a file rewritten, not appended to
            self.error = str(exc)
            self.done = True
            return
        # Every record of every run each second: kept lean (no per-value generator).
        rows = [
            tuple([_num(v) for v in map(record.get, KEPT)])
            for record in new.get("steps", ())
            if type(record.get("step")) in _NUMBER
        ]
        self.rows.extend(rows)
        for j, key in enumerate(KEPT):  # the newest finite value of each key
            for row in reversed(rows):
                if math.isfinite(row[j]):
                    self.last[key] = row[j]
                    break
        for event in new.get("events", ()):
            if isinstance(event.get("rule"), str):
                self.alert_count += 1
                self.alerts.append(event)
        if self.tail.closed:
            self.status = str(self.tail.meta.get("status") or "closed")
            self.done = True
        elif with_status:
            try:
                files = [self.path / stream_file(self.tail.meta, STREAMS[s]) for s in STREAMS]
            except RunDirError:
                files = []
            self.status = run_status(self.tail.meta, files)

    def _problem(self, message: str) -> None:
        self.error = message

    def row(self) -> RunRow:
        meta, last = self.tail.meta, self.last
        attach = meta.get("attach")
        total = attach.get("total_steps") if isinstance(attach, dict) else None
        total = total if isinstance(total, int) and not isinstance(total, bool) else None
        step = int(last.get("step", 0))
        alert = self.alerts[-1] if self.alerts else None
        pid = meta.get("pid")
        kind = "devices" if meta.get("kind") == "devices" else self.kind
        return RunRow(
            name=self.name,
            path=str(self.path),
            status=self.status,
            step=step,
            total_steps=total,
            loss=last.get("loss", math.nan),
            samples_per_s=last.get("samples_per_s", math.nan),
            tokens_per_s=last.get("tokens_per_s", math.nan),
            step_time=last.get("step_time", math.nan),
            eta_s=self._eta(total, step),
            alerts=self.alert_count,
            last_alert=str(alert.get("message", "")) if alert is not None else self.error,
            kind=kind,
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            host=str(meta.get("host", "")),
        )

    def _eta(self, total: int | None, step: int) -> float:
        """Seconds left at the step rate of the rows kept (running runs with a total only)."""
        if total is None or self.status != "running" or len(self.rows) < 2:
            return math.nan
        (s0, t0, *_), (s1, t1, *_) = self.rows[0], self.rows[-1]
        if not (t1 > t0 and s1 > s0):
            return math.nan
        return max(total - step, 0) * (t1 - t0) / (s1 - s0)

    def detail(self) -> RunDetail:
        rows = np.array(self.rows, dtype=np.float64).reshape(-1, len(KEPT))
        series = {k: rows[:, i].copy() for i, k in enumerate(KEPT)}
        return RunDetail(self.row(), series, tuple(self.alerts))


class RunsWatch:
    """The runs under ``root`` (with ``only``: the run at ``root``), followed incrementally.
    ``poll()`` reads what is new and returns the table; ``detail(path)`` the selected run's
    curves and alerts."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_runs: int = 50,
        rescan_s: float = 5.0,
        tail_bytes: int = TAIL_BYTES,
        only: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = pathlib.Path(root)
        self.only = only  # ``root`` is one run (or job) folder, followed alone
        self.max_runs = max_runs
        self.rescan_s = rescan_s
        self.tail_bytes = tail_bytes
        self._clock = clock
        self._next_scan = -math.inf
        self._runs: dict[pathlib.Path, _Followed] = {}

    def _scan(self) -> None:
        try:
            entries = [self.root] if self.only else sorted(
                (pathlib.Path(e.path) for e in os.scandir(self.root)
                 if e.is_dir(follow_symlinks=False)),
                key=lambda p: p.name,
                reverse=True,
            )  # fmt: skip
        except OSError:
            entries = []
        found: dict[pathlib.Path, _Followed] = {}
        for path in entries:
            if len(found) >= self.max_runs:
                break
            if path in self._runs:
                found[path] = self._runs[path]
                continue
            meta = read_json(path / META)
            if not isinstance(meta, dict):
                continue  # not a run (yet): meta.json is written first
            follow, kind = path, "run"
            if meta.get("layout") == LAYOUT:
                ranks = rank_dirs(path)
                if not ranks:
                    continue
                follow, kind = ranks[min(ranks)], "job"
            try:
                found[path] = _Followed(follow, path.name, kind, self.tail_bytes)
            except (OSError, ValueError, RunDirError):
                continue  # not a run nbmonitor can read: `nbmonitor runs` says why
        self._runs = found

    def poll(self) -> list[RunRow]:
        """Read what the runs wrote since the last poll; the table, newest run first."""
        now = self._clock()
        rescan = now >= self._next_scan
        if rescan:
            self._next_scan = now + self.rescan_s
            self._scan()
        for run in self._runs.values():
            run.poll(with_status=rescan or run.status == "unknown")
        return [run.row() for run in self._runs.values()]

    def detail(self, path: str) -> RunDetail | None:
        """The run at ``path`` (a row's ``path``): its recent curves and alerts."""
        for key, run in self._runs.items():
            if str(key) == path or str(run.path) == path:
                return run.detail()
        return None

    def offsets(self) -> dict[str, dict[str, int]]:
        """Per run, the bytes read so far of each stream (tests prove nothing is re-read)."""
        return {str(k): r.tail.offsets for k, r in self._runs.items()}


__all__ = ["KEPT", "RunDetail", "RunRow", "RunsWatch"]
