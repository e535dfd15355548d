"""Phases and spans, from records to rows and to what the timeline panel shows (sampler thread,
or the caller's for a replay; numpy only).

``span_rows`` turns ``SpanRecord``s into the rows of the ``spans`` stream (spans.jsonl). A
``SpanLog`` takes both kinds of row (live: as the pipeline makes them; replay: as read from
disk) and keeps, bounded, what the timeline needs: the last steps' phases and spans for the
gantt, and per name the telemetry summary (count, mean, median, std, min, max, total, % of
the time the steps took), as Oumi's timers report it.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from nbmonitor._engine.frame import GanttBar
from nbmonitor.records import PHASE_KEYS, PHASES, Record, SpanRecord
from nbmonitor.runs.column_rows import ColumnRows

# Durations kept per name for the median (the other statistics cover every value).
MEDIAN_WINDOW = 1024
# The most arrays those durations are kept in before they are joined into one.
MEDIAN_CHUNKS = 64
# Spans and step rows kept for the gantt of the last steps.
RECENT_SPANS = 4096
RECENT_STEPS = 64
GANTT_STEPS = 3
PHASE_TRACK = "phases"


def span_rows(records: Iterable[Record]) -> list[dict[str, object]]:
    """The ``spans`` stream's rows for the ``SpanRecord``s among ``records``."""
    return [
        {
            "name": r.name,
            "step": r.step,
            "start": r.start,
            "dur": r.duration,
            "depth": r.depth,
            "thread": r.thread,
        }
        for r in records
        if isinstance(r, SpanRecord)
    ]


@dataclass
class _Stats:
    kind: str
    count: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    # The last MEDIAN_WINDOW values (at least), as the arrays they came in, oldest first: not
    # a float object per value (a tick of a fast loop brings a thousand per phase).
    recent: collections.deque[np.ndarray] = field(default_factory=collections.deque)
    held: int = 0  # values in recent

    def add(self, values: Iterable[float] | np.ndarray) -> None:
        # One numpy pass per batch of values: a tick brings hundreds of steps.
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v)]
        if not v.size:
            return
        self.take(v, float(v.sum()), float(v.min()), float(v.max()))

    def take(self, v: np.ndarray, total: float, low: float, high: float) -> None:
        """Count the finite values ``v`` (not empty), whose sum, least and largest are given."""
        self.count += int(v.size)
        self.total += total
        self.squares += float(np.dot(v, v))
        self.low = min(self.low, low)
        self.high = max(self.high, high)
        recent = self.recent
        recent.append(v[-MEDIAN_WINDOW:])  # not the caller's array: a copy, or a row of one
        self.held += len(recent[-1])
        while self.held - len(recent[0]) >= MEDIAN_WINDOW:
            self.held -= len(recent.popleft())
        if len(recent) > MEDIAN_CHUNKS:  # many small batches (spans one at a time): one
            last = np.concatenate(recent)[-MEDIAN_WINDOW:]
            recent.clear()
            recent.append(last)
            self.held = len(last)

    @staticmethod
    def add_rows(stats: Sequence[_Stats], block: np.ndarray) -> None:
        """``stats[i].add(block[i])`` for every row of ``block`` (the phases of a part of
        steps), with one numpy call per statistic for all the rows when every value is
        finite (a numpy reduction costs microseconds whatever its size): the same sums."""
        if not block.shape[1]:
            return
        if not np.isfinite(block).all():
            for stat, row in zip(stats, block, strict=True):
                stat.add(row)
            return
        totals = block.sum(axis=1).tolist()  # each row's pairwise sum, as row.sum() makes it
        lows, highs = block.min(axis=1).tolist(), block.max(axis=1).tolist()
        for stat, row, total, low, high in zip(stats, block, totals, lows, highs, strict=True):
            stat.take(row, total, low, high)

    def window(self) -> np.ndarray:
        """The last ``MEDIAN_WINDOW`` values, oldest first."""
        return np.concatenate(self.recent)[-MEDIAN_WINDOW:] if self.recent else np.empty(0)

    def row(self, name: str, run_time: float) -> dict[str, object]:
        n = self.count
        mean = self.total / n
        # The sample standard deviation (0 for one value), as Oumi reports it.
        var = max(0.0, (self.squares - n * mean * mean) / (n - 1)) if n > 1 else 0.0
        return {
            "name": name,
            "kind": self.kind,
            "count": n,
            "mean_s": mean,
            "median_s": _median(self.window()),
            "std_s": math.sqrt(var),
            "min_s": self.low,
            "max_s": self.high,
            "total_s": self.total,
            "percent": 100.0 * self.total / run_time if run_time > 0 else math.nan,
        }


def _median(values: np.ndarray | Iterable[float]) -> float:
    """``statistics.median(values)``, to the bit, with numpy's sort (a sort of a thousand
    Python floats per phase per frame is most of the timeline's summary); not np.median,
    which imports numpy.ma on first use."""
    if not isinstance(values, np.ndarray):
        values = np.fromiter(values, dtype=np.float64)
    ordered = np.sort(values)
    i = ordered.size // 2
    if ordered.size % 2:
        return float(ordered[i])
    return (float(ordered[i - 1]) + float(ordered[i])) / 2


class SpanLog:
    """What the timeline shows, fed with step rows and span rows (bounded memory)."""

    def __init__(self) -> None:
        # Counts the additions: what the timeline shows is as it was while it stays the same.
        self.version = 0
        self._stats: dict[str, _Stats] = {}
        self._run_time = 0.0  # the sum of step_time: what "% of run" is a share of
        # The last steps' rows that hold phases, as the parts they came in (rows held as
        # columns stay so: the gantt makes the few rows it shows), newest last.
        self._steps: collections.deque[Sequence[Mapping[str, float]]] = collections.deque()
        self._steps_held = 0  # rows in _steps
        self._spans: collections.deque[Mapping[str, object]] = collections.deque(
            maxlen=RECENT_SPANS
        )

    def add_steps(
        self,
        rows: Sequence[Mapping[str, float]],
        columns: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        """Step rows in order; ``columns``, the same rows as columns when the caller has them
        (every row has every key), spare a pass per key over the rows."""
        if not rows:
            return
        self.version += 1
        nan = math.nan
        if columns is not None:
            times = columns.get("step_time")
            if times is None:
                times = np.full(len(rows), nan)
        else:
            times = np.array([row.get("step_time", nan) for row in rows], dtype=np.float64)
        self._run_time += float(times[np.isfinite(times)].sum())
        if columns is not None:
            held = [
                (name, key) for name, key in zip(PHASES, PHASE_KEYS, strict=True) if key in columns
            ]
            if held:
                block = np.array([columns[key] for _, key in held], dtype=np.float64)
                _Stats.add_rows([self._stat(name, "phase") for name, _ in held], block)
        else:
            for name, key in zip(PHASES, PHASE_KEYS, strict=True):
                if key in rows[-1] or key in rows[0]:
                    self._stat(name, "phase").add([row.get(key, nan) for row in rows])
        if isinstance(rows, ColumnRows):  # every row has the key, but for the first few
            if PHASE_KEYS[1] in rows.columns:
                lacking = rows.absent.get(PHASE_KEYS[1], 0)
                self._keep_steps(rows.cut(max(lacking, len(rows) - RECENT_STEPS), len(rows)))
        else:
            self._keep_steps([r for r in rows[-RECENT_STEPS:] if PHASE_KEYS[1] in r])

    def _keep_steps(self, rows: Sequence[Mapping[str, float]]) -> None:
        """Keep ``rows`` as the newest of the last ``RECENT_STEPS`` steps with phases."""
        if not rows:
            return
        self._steps.append(rows)
        self._steps_held += len(rows)
        while self._steps_held - len(self._steps[0]) >= RECENT_STEPS:
            self._steps_held -= len(self._steps.popleft())

    def add_step_columns(self, columns: Mapping[str, np.ndarray]) -> None:
        """A whole steps stream read at once (a replay): the same as its rows."""
        if "step" not in columns:
            return
        self.version += 1
        keys = [k for k in ("step", "time", "step_time", *PHASE_KEYS) if k in columns]
        n = len(columns["step"])
        if "step_time" in columns:
            finite = columns["step_time"][np.isfinite(columns["step_time"])]
            self._run_time += float(finite.sum())
        for name, key in zip(PHASES, PHASE_KEYS, strict=True):
            if key in columns:
                self._stat(name, "phase").add(columns[key].tolist())
        recent = []
        for i in range(max(0, n - RECENT_STEPS), n):
            row = {k: float(columns[k][i]) for k in keys}
            if any(math.isfinite(row.get(k, math.nan)) for k in PHASE_KEYS):
                recent.append(row)
        self._keep_steps(recent)

    def add_spans(self, rows: Iterable[Mapping[str, object]]) -> None:
        self.version += 1
        for row in rows:
            name, dur = row.get("name"), row.get("dur")
            if not isinstance(name, str) or not isinstance(dur, (int, float)):
                continue  # one bad record never costs the others
            self._stat(name, "span").add((float(dur),))
            self._spans.append(row)

    def _stat(self, name: str, kind: str) -> _Stats:
        key = f"{kind}:{name}"
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = _Stats(kind)
        return stats

    def summary(self, open_s: float = 0.0) -> tuple[dict[str, object], ...]:
        """One row per phase, then per span name (by total time): Oumi's columns. ``open_s``:
        the step time of rows still open (not added yet), part of the run's time."""
        rows = [
            stats.row(key.split(":", 1)[1], self._run_time + open_s)
            for key, stats in self._stats.items()
            if stats.count
        ]
        rows.sort(key=lambda r: (r["kind"] != "phase", -float(r["total_s"])))  # type: ignore[arg-type]
        return tuple(rows)

    def gantt(self, steps: int = GANTT_STEPS) -> tuple[GanttBar, ...]:
        """The last ``steps`` steps: their phases (laid out in order back from each step's
        end) and the spans that fell in them, on one track per nesting depth and thread."""
        shown: list[Mapping[str, float]] = []
        for part in reversed(self._steps):  # the last steps' rows, made of the newest parts
            if len(shown) >= steps:
                break
            shown[:0] = part[len(part) - min(len(part), steps - len(shown)) :]
        spans = list(self._spans)
        last = [int(r["step"]) for r in shown]
        for span in spans[-1:]:
            step = span.get("step")
            if isinstance(step, (int, float)):
                last.append(int(step))
        last_step = max(last, default=0)
        first_step = last_step - steps + 1
        bars: list[GanttBar] = []
        for row in shown:
            end = row.get("time", math.nan)
            if int(row["step"]) < first_step or not math.isfinite(end):
                continue
            t = end
            for name, key in reversed(list(zip(PHASES, PHASE_KEYS, strict=True))):
                d = row.get(key, math.nan)
                if math.isfinite(d) and d > 0:
                    t -= d
                    bars.append(GanttBar(PHASE_TRACK, name, int(row["step"]), t, d))
        for s in spans:
            step, start, dur = s.get("step"), s.get("start"), s.get("dur")
            if not (
                isinstance(step, (int, float))
                and isinstance(start, (int, float))
                and isinstance(dur, (int, float))
            ):
                continue
            if step >= first_step:
                bars.append(GanttBar(_track(s), str(s.get("name")), int(step), start, dur))
        if not bars:
            return ()
        origin = min(b.start_s for b in bars)
        return tuple(
            GanttBar(b.track, b.name, b.step, b.start_s - origin, b.duration_s) for b in bars
        )


def _track(span: Mapping[str, object]) -> str:
    depth = span.get("depth", 0)
    thread = span.get("thread", 0)
    where = f"spans{'' if not thread else f' (thread {thread})'}"
    return where if not depth else f"{where} depth {depth}"


__all__ = ["GanttBar", "SpanLog", "span_rows"]
