"""A run's steps, phases and spans as a Chrome/Perfetto trace (``traceEvents`` JSON).

Open the file in https://ui.perfetto.dev or ``chrome://tracing``. Each rank of the run is one
process (pid); within it one track (tid) holds the steps, one the phases (laid out in order
back from each step's end: data, forward, backward, other, optimizer; on a GPU their lengths
are the device's), and one per thread the spans (``mon.span``), nested by time. Times are Unix
microseconds, so the ranks of a run line up.

Stdlib and numpy only (any thread, no torch).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

from nbmonitor.records import PHASE_KEYS, PHASES
from nbmonitor.runs.files import RunFolder
from nbmonitor.runs.format import META, write_atomic
from nbmonitor.runs.layout import rank_dirs
from nbmonitor.runs.reader import Run

STEPS_TID, PHASES_TID, SPANS_TID = 1, 2, 3


def rank_runs(path: str | os.PathLike[str]) -> Iterator[tuple[int, Run]]:
    """The run at ``path`` as rank 0 (or the rank its meta.json names), then each ``rank<N>``
    folder in it that holds a run, by rank."""
    root = pathlib.Path(path)
    if RunFolder(root).is_file([META]):
        run = Run(root)
        rank = run.meta.get("rank", 0)
        yield (rank if type(rank) is int and 0 <= rank < 2**31 else 0), run
    for rank, sub in rank_dirs(root).items():
        yield rank, Run(sub)


def chrome_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The trace of the run at ``path`` (every rank found there) as a JSON-ready dict."""
    events: list[dict[str, Any]] = []
    for rank, run in rank_runs(path):
        events += _meta(rank, 0, "process_name", f"rank {rank}")
        events += _meta(rank, STEPS_TID, "thread_name", "steps")
        events += _meta(rank, PHASES_TID, "thread_name", "phases")
        events += _steps(rank, run.columns("steps"))
        events += _spans(rank, run.records("spans"))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> pathlib.Path:
    """Write the trace of the run at ``path`` to ``out`` (a ``.json`` file); returns it."""
    target = pathlib.Path(out)
    if target.is_dir():
        raise ValueError(
            f"nbmonitor: export_trace(path) got a folder, '{target}'; pass a file name, "
            "e.g. 'trace.json'."
        )
    trace = chrome_trace(path)
    # Encoded whole, then written atomically: a failure halfway leaves any earlier file as it
    # was, never a truncated one.
    data = json.dumps(trace, allow_nan=False, separators=(",", ":")).encode()
    write_atomic(target, data)
    return target


def _meta(pid: int, tid: int, what: str, name: str) -> list[dict[str, Any]]:
    return [{"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {"name": name}}]


def _x(name: str, pid: int, tid: int, start_s: float, dur_s: float, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": "nbmonitor",
        "pid": pid,
        "tid": tid,
        "ts": round(start_s * 1e6, 3),
        "dur": round(dur_s * 1e6, 3),
        "args": args,
    }


def _steps(pid: int, columns: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    if "step" not in columns or "time" not in columns:
        return
    step_col, time_col = columns["step"], columns["time"]
    step_time = columns.get("step_time")
    phases = [(name, columns[key]) for name, key in zip(PHASES, PHASE_KEYS, strict=True)
              if key in columns]  # fmt: skip
    for i in range(len(step_col)):
        step, end = float(step_col[i]), float(time_col[i])
        if not (math.isfinite(step) and math.isfinite(end)):
            continue
        if step_time is not None and math.isfinite(step_time[i]) and step_time[i] > 0:
            d = float(step_time[i])
            yield _x(f"step {int(step)}", pid, STEPS_TID, end - d, d, step=int(step))
        t = end
        for name, values in reversed(phases):
            d = float(values[i])
            if math.isfinite(d) and d > 0:
                t -= d
                yield _x(name, pid, PHASES_TID, t, d, step=int(step))


def _spans(pid: int, records: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    tids: dict[object, int] = {}
    for r in records:
        name, start, dur = r.get("name"), r.get("start"), r.get("dur")
        if not (
            isinstance(name, str)
            and isinstance(start, (int, float))
            and isinstance(dur, (int, float))
            and math.isfinite(start)
            and math.isfinite(dur)
        ):
            continue  # one bad record never costs the others
        thread = r.get("thread", 0)
        tid = tids.get(thread)
        if tid is None:
            tid = tids[thread] = SPANS_TID + len(tids)
            label = "spans" if not thread else f"spans (thread {thread})"
            yield from _meta(pid, tid, "thread_name", label)
        yield _x(name, pid, tid, float(start), float(dur), step=r.get("step"))


__all__ = ["chrome_trace", "rank_runs", "write_trace"]
