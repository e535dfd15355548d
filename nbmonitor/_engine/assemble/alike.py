"""Runs of alike steps read as columns: the records stage's fast path (sampler thread only).

A fast loop brings hundreds of steps a tick, nearly all as one record each (the StepRecord,
its phases and the loss logged after ``step()`` folded in), some with a LogRecord or two.
Read record by record (``steps.py``) a step cost ~35 us of the sampler's Python, most of it
small dict operations per value. Here a run of
steps whose records are alike is read one field at a time for the whole run, a list
comprehension per field, into the columns of exactly the rows the record-by-record path builds:
the same keys in the same order, the same float operations in the same order.

``plan`` cuts a tick's records into segments: runs of steps that are alike and that no other
record of the tick touches (read here), and everything else (read record by record: a mon.log
of extra keys, several sources of a loss, a value still on a device that failed, the first
steps, a sampled step with its per-layer records). ``read`` reads one run, or says it cannot
(None), having changed nothing: the caller then reads it in parts, down to record by record.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.assemble.step_norms import (
    LayerNorms,
    alike_groups,
    read_matrix,
    read_norms,
)
from nbmonitor._engine.derive.mfu import StepFlops, T
from nbmonitor.records import (
    FROM_BACKWARD,
    LOGGED,
    PHASE_KEYS,
    LogRecord,
    MemoryRecord,
    Record,
    SpanRecord,
    StepColumns,
    StepRecord,
)

# The kinds of record a step of an alike run may bring: those that make its row, and those
# that others read (spans, memory breakdowns), not the assembler.
_ROW_KINDS = frozenset((StepRecord, LogRecord))
_KINDS = _ROW_KINDS | {SpanRecord, MemoryRecord}
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
# A run of fewer steps is read record by record: reading columns has a cost per run.
MIN_RUN = 2
# The record kinds as numbers for plan(); the kinds that make rows are _STEP.._LOG.
_STEP, _LOG = 1, 2


class _Codes(dict[type, int]):
    def __missing__(self, kind: type) -> int:
        return 7  # every other kind: never alike, touches no row (not 0: a digit of its own)


_CODES = _Codes({StepRecord: _STEP, LogRecord: _LOG, SpanRecord: 4, MemoryRecord: 5})
# The most records a step of an alike run may have (3 bits each in an int64).
_LONGEST = 20
_step = attrgetter("step")

_source = attrgetter("source")


@dataclass(frozen=True, slots=True)
class Segment:
    """Records ``[start, end)`` of a tick: ``width`` records a step for a run of alike steps,
    0 for records read one by one."""

    start: int
    end: int
    width: int = 0
    # The run's last step stays open: it is the last to end in the tick, so a later mon.log
    # may add to it (read with the run, then held as a row read one by one).
    open_last: bool = False


@dataclass(slots=True)
class AlikeSteps:
    """The rows of a run of steps before they are finished (``steps.StepAssembler``): what a
    ``steps._Row`` holds, as columns. ``values`` are the measured values in the row's order;
    ``sums`` the logged values of each key summed over the step's records (``counts`` of them a
    step), all from ``source``. ``norms`` go to the layer statistics."""

    steps: list[int]
    values: dict[str, list[float]]
    sums: dict[str, list[float]]
    counts: dict[str, int]
    source: int
    norms: list[LayerNorms]

    def __len__(self) -> int:
        return len(self.steps)

    def cut(self, i: int) -> tuple[AlikeSteps, AlikeSteps]:
        """The steps before ``i`` and from ``i`` on (the layer norms stay with neither: they
        were handed on when the run was read)."""

        def part(s: slice) -> AlikeSteps:
            return AlikeSteps(
                self.steps[s],
                {k: v[s] for k, v in self.values.items()},
                {k: v[s] for k, v in self.sums.items()},
                self.counts,
                self.source,
                [],
            )

        return part(slice(None, i)), part(slice(i, None))

    def logged(self) -> dict[str, list[float]]:
        """The logged columns as the row gives them: the roots of a step's backward passes
        add up, several values of any other source are averaged (``steps._Row.build``)."""
        if self.source == FROM_BACKWARD:
            return dict(self.sums)
        return {k: [t / self.counts[k] for t in v] for k, v in self.sums.items()}


def plan(records: Sequence[Record], open_steps: Any = ()) -> list[Segment]:
    """``records`` (a tick's, in order) as segments in order. A step is read in an alike run
    when its records are contiguous and of the run's kinds in the run's order, no other record
    of the tick (before or after) is of its step, none of ``open_steps`` (rows still open) is
    its step, and a later step ends in the tick: its row is final once the tick is read, as
    the record-by-record path would make it."""
    n = len(records)
    if n < 2 * MIN_RUN:
        return [Segment(0, n)] if n else []
    # A group: consecutive records of one step. numpy over the records, Python over the runs.
    kinds = list(map(type, records))
    steps = np.array(list(map(_step, records)), dtype=np.int64)
    codes = np.array(list(map(_CODES.__getitem__, kinds)), dtype=np.int64)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(steps[1:], steps[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    sizes = np.diff(starts, append=n)
    group_steps = steps[starts]
    # The kinds of a group in their order as one number (three bits a record), to compare
    # groups; longer groups are never alike.
    at = np.arange(n) - np.repeat(starts, sizes)
    key = np.add.reduceat(codes << (3 * np.minimum(at, _LONGEST)), starts)
    key[sizes > _LONGEST] = -1
    usable = np.zeros(len(starts), dtype=bool)
    # Not np.unique: it imports numpy.ma (~20 ms holding the GIL) the first time.
    for k in dict.fromkeys(key.tolist()):
        one = int(np.argmax(key == k))
        a = int(starts[one])
        if k >= 0 and _usable(tuple(kinds[a : a + int(sizes[one])])):
            usable |= key == k
    # Per group: the smallest step a later record of a row touches, and the largest step a
    # later StepRecord ends.
    touches = np.logical_or.reduceat((codes >= _STEP) & (codes <= _LOG), starts)
    ends_step = np.logical_or.reduceat(codes == _STEP, starts)
    big = np.iinfo(np.int64).max
    later_touch = np.minimum.accumulate(np.where(touches, group_steps, big)[::-1])[::-1]
    later_end = np.maximum.accumulate(np.where(ends_step, group_steps, -big)[::-1])[::-1]
    untouched = usable.copy()
    untouched[:-1] &= group_steps[:-1] < later_touch[1:]
    if len(open_steps):
        # A set, not np.isin: it imports numpy.ma (~40 ms holding the GIL) the first time.
        opened = set(open_steps)
        untouched &= np.array([s not in opened for s in group_steps.tolist()], dtype=bool)
    ended = np.zeros(len(starts), dtype=bool)
    ended[:-1] = group_steps[:-1] < later_end[1:]
    ok = untouched & ended
    # A run goes on while its groups are alike, of the same kinds, their steps rising.
    goes_on = np.zeros(len(starts), dtype=bool)
    goes_on[1:] = ok[1:] & ok[:-1] & (key[1:] == key[:-1]) & (group_steps[1:] > group_steps[:-1])
    breaks = np.flatnonzero(~goes_on)
    first = breaks[ok[breaks]]
    last = np.append(breaks, len(starts))[np.searchsorted(breaks, first, side="right")]
    segments: list[Segment] = []
    done = 0
    group_ends = np.append(starts[1:], n)
    for i, j in zip(first.tolist(), last.tolist(), strict=True):
        # The step after the run, alike but not final (the tick's last to end): read with it.
        open_last = bool(
            j < len(starts)
            and untouched[j]
            and key[j] == key[j - 1]
            and group_steps[j] > group_steps[j - 1]
        )
        j += open_last
        if j - i < MIN_RUN:
            continue
        a, b = int(starts[i]), int(group_ends[j - 1])
        if a > done:
            segments.append(Segment(done, a))
        segments.append(Segment(a, b, int(sizes[i]), open_last))
        done = b
    if done < n:
        segments.append(Segment(done, n))
    return segments


def _usable(pattern: tuple[type, ...]) -> bool:
    return pattern.count(StepRecord) == 1 and _KINDS.issuperset(pattern)


def read(
    records: Sequence[Record], width: int, flops: StepFlops | None, taken: Any = ()
) -> AlikeSteps | None:
    """The run of alike steps in ``records`` (``width`` records a step, as ``plan`` found
    them) as columns; None when its steps are not alike after all (the caller reads them in
    parts), or one of them is in ``taken`` (rows already open). Changes nothing."""
    pattern = [type(r) for r in records[:width]]
    at = pattern.index(StepRecord)
    ends: list[StepRecord] = records[at::width]  # type: ignore[assignment]
    # Every field of every StepRecord in one pass (a record's fields are near each other in
    # memory, the records are not: a pass per field would fetch each record again).
    fields = _fields(ends)
    steps: list[int] = list(fields[0])
    if not taken or set(steps).isdisjoint(taken):
        try:
            values = _measured(ends, fields, flops)
            logged = _logged(records, pattern, width, fields[-1]) if values is not None else None
        except Exception:  # a value that cannot be read: the record-by-record path reports it
            return None
        if values is not None and logged is not None:
            sums, counts, source = logged
            if values[0].keys().isdisjoint(sums):
                return AlikeSteps(steps, values[0], sums, counts, source, values[1])
    return None


_STEP_FIELDS = (
    "step", "time", "step_time", "samples", "tokens", "micro_batches", "lrs", "norms",
    "clip_norm", "max_norm", "skipped", "groups_added", "phases", "loss",
)  # fmt: skip
_fields_of = attrgetter(*_STEP_FIELDS)


def _fields(ends: list[StepRecord]) -> list[tuple[Any, ...]]:
    return list(zip(*map(_fields_of, ends), strict=True))


def _measured(
    ends: list[StepRecord], fields: list[tuple[Any, ...]], flops: StepFlops | None
) -> tuple[dict[str, list[float]], list[LayerNorms]] | None:
    """The measured columns in the order ``steps.StepAssembler`` writes them (the phases, then
    the StepRecord's values, then grad_norm), and the layer norms; None if not alike."""
    (_, time, step_time, samples, tokens, micro, lrs, norms, clip, max_norm, skipped, added) = (
        fields[:12]
    )
    n = len(ends)
    values: dict[str, list[float]] = {}
    phases = fields[12]
    untimed = phases.count(None)
    if untimed != n and (untimed or not _phases(ends, phases, values)):
        return None
    if any(skipped) or any(added):
        return None
    if not _scalars(values, n, time, step_time, samples, tokens, micro, lrs, flops):
        return None
    layer_norms: list[LayerNorms] = []
    without = sum(v is None for v in norms)
    if without != n:
        if without:
            return None
        totals: list[float] = []
        for group in alike_groups(ends):
            total, read_ = read_norms(group)
            totals += total
            layer_norms.append(read_)
        values["grad_norm"] = totals
    if not _clipped(values, n, clip, max_norm):
        return None
    return values, layer_norms


def _scalars(
    values: dict[str, list[float]],
    n: int,
    time: Sequence[float],
    step_time: Sequence[float],
    samples: Sequence[int],
    tokens: Sequence[int],
    micro: Sequence[int],
    lrs: Sequence[tuple[Any, ...]],
    flops: StepFlops | None,
) -> bool:
    """The columns from a StepRecord's plain fields into ``values``, in the row's order;
    False if the steps are not alike."""
    values["time"] = list(time)
    values["step_time"] = list(step_time)
    values["micro_batches"] = list(map(float, micro))
    nan = math.nan
    for key, counted in (("samples", samples), ("tokens", tokens)):
        none = counted.count(0)  # as `if record.samples:` (ints)
        if none == n:
            continue
        if none:
            return False
        values[key] = list(map(float, counted))
        values[f"{key}_per_s"] = [
            c / t if t > 0 else nan for c, t in zip(counted, step_time, strict=True)
        ]
    if flops is not None:
        rates = flops.step_columns(tokens, samples, step_time)
        if rates is None:
            return False
        values.update(rates)
    width_lr = len(lrs[0])
    if set(map(len, lrs)) != {width_lr}:
        return False
    for i, column in enumerate(zip(*lrs, strict=True)):
        values["lr" if i == 0 else f"lr_group{i}"] = [
            lr if isinstance(lr, float) else lr.values()[0] for lr in column
        ]
    return True


def _clipped(
    values: dict[str, list[float]], n: int, clip: Sequence[Any], max_norm: Sequence[float]
) -> bool:
    """What clip_grad_norm_ returned replaces the norm from the per-parameter ones; False if
    the steps are not alike."""
    unclipped = list(clip).count(None)
    if unclipped != n:
        if unclipped:
            return False
        totals = [v.values()[0] for v in clip]
        values["grad_norm"] = totals
        finite = sum(map(math.isfinite, max_norm))
        if finite == n:
            values["grad_clip_coef"] = [
                min(1.0, m / (t + 1e-6)) for m, t in zip(max_norm, totals, strict=True)
            ]
        elif finite:
            return False
    return True


def read_columns(cols: StepColumns, flops: StepFlops | None, taken: Any = ()) -> AlikeSteps | None:
    """``read`` of steps written as columns (``records.StepColumns``: every one ordinary, no
    other record of theirs in the tick): the same columns as their records would give, in
    numpy (the same float operations, element by element) rather than a Python expression a
    row; None when they are not alike after all (the caller reads them as records). Changes
    nothing."""
    steps = cols.steps
    n = len(steps)
    if taken and not set(steps).isdisjoint(taken):
        return None
    values: dict[str, list[float]] = {}
    try:
        phases = cols.phases
        if phases[0] is not None:
            # (zip over the tuples: numpy's conversion of a list of tuples costs more)
            values.update(zip(PHASE_KEYS, map(list, zip(*phases, strict=True)), strict=True))
        step_time = np.array(cols.step_time, dtype=np.float64)
        values["time"] = list(cols.time)
        values["step_time"] = list(cols.step_time)
        values["micro_batches"] = list(map(float, cols.micro_batches))
        positive = step_time > 0
        counts: dict[str, Any] = {}
        for key, counted in (("samples", cols.samples), ("tokens", cols.tokens)):
            none = counted.count(0)  # as `if record.samples:` (ints)
            if none == n:
                continue
            if none:
                return None
            values[key] = as_floats = list(map(float, counted))
            column = counts[key] = np.array(as_floats, dtype=np.float64)
            values[f"{key}_per_s"] = _per_s(column, step_time, positive).tolist()
        if flops is not None:
            rates = _flops_columns(flops, counts, step_time, positive, n)
            if rates is None:
                return None
            values.update(rates)
        lrs = cols.lrs
        width = len(lrs[0])
        if set(map(len, lrs)) != {width}:
            return None
        for i, lr_column in enumerate(zip(*lrs, strict=True)):
            values["lr" if i == 0 else f"lr_group{i}"] = list(lr_column)
        layer_norms: list[LayerNorms] = []
        tail = cols.norm_tail
        if tail is not None:
            head = cols.norm_head
            layout = cols.norms_layout
            if head is None and layout is not None:
                head = np.empty((n, 0), dtype=np.float64)
            totals, norms = read_matrix(tuple(steps), head, tail, layout, cols.norm_index)
            values["grad_norm"] = totals
            layer_norms.append(norms)
        if not _clipped(values, n, cols.clip_norm, cols.max_norm):
            return None
    except Exception:  # a value that cannot be read: the record-by-record path reports it
        return None
    losses = cols.loss
    unlogged = losses.count(None)
    if unlogged == n:
        return AlikeSteps(list(steps), values, {}, {}, -1, layer_norms)
    if unlogged or "loss" in values:
        return None
    # As steps._Row.add_logged: from 0.0 (floats only: Recorder.fold_loss folds no other).
    sums = {"loss": [0.0 + v for v in losses]}  # type: ignore[operator]
    return AlikeSteps(list(steps), values, sums, {"loss": 1}, LOGGED, layer_norms)


def _per_s(counted: FloatArray, step_time: FloatArray, positive: BoolArray) -> FloatArray:
    """``c / t if t > 0 else nan`` of each step."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(positive, counted / step_time, math.nan)


def _flops_columns(
    flops: StepFlops,
    counts: dict[str, FloatArray],
    step_time: FloatArray,
    positive: BoolArray,
    n: int,
) -> dict[str, list[float]] | None:
    """``StepFlops.step_columns`` in numpy: the same numbers, {} when no step has them, None
    when some have and some have not."""
    zero = np.zeros(n)
    tokens, samples = counts.get("tokens", zero), counts.get("samples", zero)
    per_token, per_sample = flops.per_token, flops.per_sample
    by_token = tokens > 0 if math.isfinite(per_token) else np.zeros(n, dtype=bool)
    by_sample = ~by_token & (samples > 0 if math.isfinite(per_sample) else by_token)
    known = int(np.count_nonzero(by_token | by_sample))
    if known == 0:
        return {}
    if known < n:
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        per_step = np.where(by_token, per_token * tokens, per_sample * samples)
        with np.errstate(divide="ignore"):
            rates = np.where(positive, per_step / step_time, math.nan)
        peak = flops.peak
        if math.isfinite(peak) and peak > 0:
            mfu = np.where(np.isfinite(rates), 100.0 * rates / peak, math.nan)
        else:
            mfu = np.full(n, math.nan)
    return {
        "flops_per_step": per_step.tolist(),
        "tflops_per_s": (rates / T).tolist(),
        "mfu_percent": mfu.tolist(),
    }


def _phases(
    ends: list[StepRecord], durations: Sequence[Any], values: dict[str, list[float]]
) -> bool:
    if set(map(type, durations)) != {tuple}:
        durations = [r.phase_values() for r in ends]
    if set(map(len, durations)) != {len(PHASE_KEYS)}:
        return False
    values.update(zip(PHASE_KEYS, map(list, zip(*durations, strict=True)), strict=True))
    return True


def _logged(
    records: Sequence[Record], pattern: list[type], width: int, losses: tuple[Any, ...]
) -> tuple[dict[str, list[float]], dict[str, int], int] | None:
    """The logged values summed per key over each step's LogRecords (and the loss folded
    into its StepRecord, ``losses``) in their order, the number of values per key a step, and
    their source; None unless every step logs the same keys in the same order from one
    source, every value read."""
    sums: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    source = -1
    for at, kind in enumerate(pattern):
        if kind is StepRecord:
            unlogged = losses.count(None)
            if unlogged == len(losses):
                continue
            if unlogged or (source >= 0 and source != LOGGED):
                return None
            source = LOGGED
            if set(map(type, losses)) != {float}:
                ends: list[StepRecord] = records[at::width]  # type: ignore[assignment]
                losses = tuple(r.loss_value() for r in ends)  # raises: not read as columns
            total = sums.get("loss")
            sums["loss"] = (
                [0.0 + v for v in losses]
                if total is None
                else [t + v for t, v in zip(total, losses, strict=True)]
            )
            counts["loss"] = counts.get("loss", 0) + 1
            continue
        if kind is LogRecord:
            logs: list[LogRecord] = records[at::width]  # type: ignore[assignment]
            sources = set(map(_source, logs))
            if len(sources) != 1 or (source >= 0 and source not in sources):
                return None
            source = sources.pop()
            if any(r.dropped for r in logs):
                return None
            if any(r.tensors for r in logs):
                resolved = [r.resolve() for r in logs]
                if any(failed for _, failed in resolved):
                    return None
                dicts = [values for values, _ in resolved]
            else:
                dicts = [r.numbers for r in logs]
        else:
            continue
        keys = tuple(dicts[0])
        if not keys:
            if any(dicts):
                return None
            continue
        if len(set(map(tuple, dicts))) != 1:
            return None
        if len(keys) == 1:
            columns: list[Any] = [list(map(itemgetter(keys[0]), dicts))]
        else:
            columns = list(zip(*map(itemgetter(*keys), dicts), strict=True))
        for key, column in zip(keys, columns, strict=True):
            # As steps._Row.add_logged: from 0.0, in the records' order.
            total = sums.get(key)
            sums[key] = (
                [0.0 + v for v in column]
                if total is None
                else [t + v for t, v in zip(total, column, strict=True)]
            )
            counts[key] = counts.get(key, 0) + 1
    return sums, counts, source
