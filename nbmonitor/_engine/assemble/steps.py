"""Turns drained records into per-step rows (sampler thread only).

A step's row is open while values for it may still arrive (``mon.log`` after ``optimizer.step``)
and becomes final once a later step has ended, at a flush (every step that has ended), or at
close. At close, a row whose step never ended (a loop interrupted mid-step) is not a step and is
dropped, unless no step ever ended (a run that only logs). A value that arrives for a step a
flush already wrote is reported, not written as a second row of that step.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from nbmonitor._engine.assemble import alike
from nbmonitor._engine.assemble.alike import AlikeSteps
from nbmonitor._engine.assemble.step_norms import LayerNorms, alike_groups, read_norms
from nbmonitor._engine.derive.mfu import StepFlops
from nbmonitor._engine.handover import SLICE
from nbmonitor.records import (
    FROM_BACKWARD,
    LOGGED,
    PHASE_KEYS,
    AuxRecord,
    FlopsRecord,
    LogRecord,
    OptimizerRecord,
    Pending,
    Record,
    StepColumns,
    StepRecord,
    StructureRecord,
)
from nbmonitor.runs.column_rows import ColumnRows

# Exponential smoothing of the loss for display (about a 20-step window), debiased like Adam so
# the first points are not pulled towards zero.
SMOOTHING = 0.95
# The records of alike runs that one slice of ``StepAssembler.feed`` may read (~170 steps of
# three records, 0.3-0.6 ms): each costs a tenth to a twentieth of one read record by record,
# and a run has a cost of its own (numpy calls), so a slice holds 32 of those or this many.
ALIKE_SLICE = 16 * SLICE
# The most rows ``StepAssembler.take`` hands on in one part: rows of alike runs go on as
# columns (about 1 us each to finish, cap, store and put in the outbox: ~0.5 ms a part), a
# row read record by record costs about twice that (``ONE_BY_ONE``: it counts as two); and a
# part costs ~0.1 ms whatever its size (a numpy call per column, the span log's statistics).
TAKE_ROWS = 16 * SLICE
ONE_BY_ONE = 2
# The kinds of record that make a step's row.
_ROWS = (StepRecord, LogRecord, StepColumns)


@dataclass
class _Row:
    values: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    # Values from the other sources (records.LogRecord.source), for keys mon.log() did not
    # give this step: the backward passes' roots, then the model output's .loss.
    implicit: dict[int, _Row] | None = None

    def add_logged(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value
        self.counts[key] = self.counts.get(key, 0) + 1

    def build(self, step: int) -> dict[str, float]:
        row = {"step": float(step)}
        row.update(self.values)
        if self.implicit is not None:
            # The lowest-precedence source first, each overwritten by the ones before it.
            for source in sorted(self.implicit, reverse=True):
                part = self.implicit[source]
                # The roots of a step's backward passes add up (each micro-batch's share of the
                # step's loss); several .loss outputs (micro-batches) are averaged.
                summed = source == FROM_BACKWARD
                for key, total in part.sums.items():
                    if key not in self.sums:
                        row[key] = total if summed else total / part.counts[key]
        # Several values for one key in one step (gradient accumulation) are averaged.
        for key, total in self.sums.items():
            row[key] = total / self.counts[key]
        return row


@dataclass(slots=True)
class StepRows:
    """Final rows of consecutive steps, in step order; ``columns`` are the same rows as
    columns when every row has every key in the same order (a run of alike steps: NaN in the
    first rows of a key they lack), else None. With ``columns``, ``rows`` is a ``ColumnRows``
    of them: no dict is made per row unless a reader asks for one."""

    rows: Sequence[dict[str, float]]
    columns: dict[str, list[float]] | None = None

    @property
    def last_step(self) -> int:
        if self.columns is not None:
            return int(self.columns["step"][-1])
        return int(self.rows[-1]["step"])


class StepAssembler:
    """Merges StepRecords and LogRecords into one row per step.

    ``device`` names the accelerator (read once a FLOPs count arrives), for the MFU peak.

    A tick's records come through ``feed``: runs of alike steps are read as columns
    (``alike.py``), everything else record by record (``add``), into the same rows.
    """

    def __init__(self, device: Callable[[], str | None] = lambda: None) -> None:
        self._device = device
        # Training FLOPs per token/sample, from the one counted forward; None until it comes.
        self.flops: StepFlops | None = None
        self.optimizer: OptimizerRecord | None = None  # what the monitor's optimizer is
        self._open: dict[int, _Row] = {}
        # Final rows of runs of alike steps, read as columns, not yet taken; in step order.
        self._alike: list[AlikeSteps] = []
        self._last_ended = 0
        self._taken_through = -1  # the newest step whose row was taken (none yet)
        self._ema = 0.0
        self._ema_weight = 0.0
        self.layer_norms: list[LayerNorms] = []
        self.aux: list[tuple[AuxRecord, list[float]]] = []
        # Structural facts read by the training side (records.StructureRecord), resolved.
        self.structure: list[tuple[int, str, Mapping[str, object]]] = []
        # What could not be read since the caller last took it: (source, error), e.g.
        # ("log:acc", ValueError(...)). The rest of each record, and every other record, is kept.
        self.failures: list[tuple[str, Exception]] = []
        # Param groups added mid-run, for the caller to report: (step, time, groups_added).
        self.groups_added: list[tuple[int, float, tuple[tuple[int, int, int], ...]]] = []

    def feed(self, records: Sequence[Record]) -> Iterator[Sequence[Record]]:
        """Add ``records`` (a tick's, in order) slice by slice, yielding each slice once it is
        added, so that the caller can hand the GIL over between two (``handover.py``). A slice
        holds at most ``SLICE`` records read one by one, or ``ALIKE_SLICE`` of alike runs
        (each costs about a tenth), or a mix in that proportion; steps written as columns
        (``StepColumns``, a block of them a record) are read at once, a slice of their own."""
        kinds = list(map(type, records))
        if StepColumns not in kinds:
            yield from self._feed(records, kinds, 0, len(records))
            return
        at = 0
        for i, kind in enumerate(kinds):
            if kind is StepColumns:
                if at < i:
                    yield from self._feed(records, kinds, at, i)
                yield from self._add_block(records, kinds, i)
                at = i + 1
        if at < len(records):
            yield from self._feed(records, kinds, at, len(records))

    def _feed(
        self, records: Sequence[Record], kinds: list[type], start: int, stop: int
    ) -> Iterator[Sequence[Record]]:
        """``feed`` of records ``[start, stop)`` (``kinds`` their types), none of them
        ``StepColumns``."""
        part = records[start:stop] if start or stop < len(records) else records
        if len(part) < SLICE and len(part) < len(records):
            # A few records between steps written as columns (a sampled step's): planning
            # alike runs costs more than it would save.
            self.add(part)
            yield part
            return
        if not any(kind in _ROWS for kind in itertools.islice(kinds, start, stop)):
            # No step's row among them (the sampled steps' records beside a block of steps):
            # nothing to plan.
            for at in range(0, len(part), SLICE):
                piece = part[at : at + SLICE]
                self.add(piece)
                yield piece
            return
        done = used = 0  # records [done, at) are added and not yet yielded; their cost
        for segment in alike.plan(part, self._open):
            width = segment.width
            cost = 1 if width else ALIKE_SLICE // SLICE
            at = segment.start
            while at < segment.end:
                room = (ALIKE_SLICE - used) // cost
                if width:
                    room -= room % width
                if room <= 0 and used:
                    yield part[done:at]
                    done, used = at, 0
                    continue
                end = min(segment.end, at + max(room, width or 1))
                if width:
                    self._add_alike(part[at:end], width, segment.open_last and end == segment.end)
                else:
                    self.add(part[at:end])
                used += (end - at) * cost
                at = end
        if done < len(part):
            yield part[done:]

    def _add_block(
        self, records: Sequence[Record], kinds: list[type], i: int
    ) -> Iterator[Sequence[Record]]:
        """Add the steps written as columns, ``records[i]``, ``ALIKE_SLICE`` rows a slice: as
        columns but for a first step that other records of the tick (or a row still open)
        touch and a last step that later records of the tick touch, each read as its record;
        the last stays open when no later step ends in the tick."""
        cols: StepColumns = records[i]  # type: ignore[assignment]
        steps = cols.steps
        first, last, n = steps[0], steps[-1], len(steps)
        touched_first = first in self._open or any(
            r.step >= first for r, k in zip(records[:i], kinds[:i], strict=True) if k in _ROWS
        )
        touched_last = ended_later = False
        for r, k in zip(records[i + 1 :], kinds[i + 1 :], strict=True):
            if k in _ROWS:
                touched_last = touched_last or r.step <= last
                ended_later = ended_later or k is not LogRecord
        a = 1 if touched_first else 0
        b = n - 1 if touched_last and n > a else n
        if a:
            self.add([cols.record(0)])
        for start in range(a, b, ALIKE_SLICE):
            end = min(b, start + ALIKE_SLICE)
            part = cols if (start, end) == (0, n) else cols.cut(start, end)
            open_last = end == n and not ended_later
            run = alike.read_columns(part, self.flops, self._open)
            if run is not None and self._alike and run.steps[0] <= self._alike[-1].steps[-1]:
                run = None  # rows left from a tick whose taking failed: in order, one by one
            if run is None:  # as records: what cannot be read is reported there
                self._add_alike([part.record(j) for j in range(len(part))], 1, open_last)
            else:
                self._add_run(run, open_last)
            if end < b:
                yield records[i : i + 1]
        if b < n:
            self.add([cols.record(n - 1)])
        yield records[i : i + 1]

    def _add_alike(self, records: Sequence[Record], width: int, open_last: bool = False) -> None:
        taken = self._open
        run = alike.read(records, width, self.flops, taken)
        if run is not None and self._alike and run.steps[0] <= self._alike[-1].steps[-1]:
            run = None  # rows left from a tick whose taking failed: in order, one by one
        if run is None:
            # Not alike after all (a value that cannot be read, a key logged once): halves,
            # down to single steps read record by record, which reports what failed.
            steps = len(records) // width
            if steps == 1:
                self.add(records)
            else:
                half = steps // 2 * width
                self._add_alike(records[:half], width)
                self._add_alike(records[half:], width, open_last)
            return
        self._add_run(run, open_last)

    def _add_run(self, run: AlikeSteps, open_last: bool) -> None:
        self.layer_norms += run.norms
        self._last_ended = max(self._last_ended, run.steps[-1])
        if open_last:  # the tick's last step: its row stays open, as one read record by record
            run, last = run.cut(len(run) - 1)
            self._open[last.steps[0]] = _row_of(last, 0)
        if len(run):
            self._alike.append(run)

    def add(self, records: Sequence[Record]) -> None:
        """Add ``records`` one by one (``feed`` adds a tick's)."""
        with_norms: list[StepRecord] = []
        clipped: list[StepRecord] = []
        for record in records:
            try:
                if isinstance(record, StepRecord):
                    self._add_step(record)
                    if record.norms is not None:
                        with_norms.append(record)
                    if record.clip_norm is not None:
                        clipped.append(record)
                    if record.groups_added:
                        self.groups_added.append((record.step, record.time, record.groups_added))
                # The kinds every step brings first: a tick tests hundreds of records.
                elif isinstance(record, LogRecord):
                    self._add_logged(record)
                elif isinstance(record, AuxRecord):
                    self.aux.append((record, record.value.values()))
                elif isinstance(record, OptimizerRecord):
                    self.optimizer = record
                elif isinstance(record, StructureRecord):
                    self.structure.append((record.step, record.kind, record.resolve()))
                elif isinstance(record, FlopsRecord):
                    self.flops = StepFlops.from_count(
                        record.forward_flops,
                        record.tokens,
                        record.samples,
                        record.dtype,
                        self._device(),
                    )
            except Exception as exc:
                self.failures.append((f"records:{type(record).__name__}", exc))
        self._add_norms(with_norms)
        for record in clipped:
            try:
                self._add_clip(record)
            except Exception as exc:  # its grad_norm is then the norms' (if read), not lost
                self.failures.append(("records:grad_norm", exc))

    def _row(self, step: int) -> _Row:
        # Not setdefault(step, _Row()): that builds a row (three dicts) for every record of a
        # step whose row exists, three times a step.
        row = self._open.get(step)
        if row is None:
            row = self._open[step] = self._unread(step) if self._alike else _Row()
        return row

    def _unread(self, step: int) -> _Row:
        """The row of ``step`` as the record-by-record path would hold it, out of the alike
        run that has it (a new row if none has): a record of a step read in a run arrived
        after the run was read (a tick whose rows were not all taken)."""
        found = [
            (i, at)
            for i, run in enumerate(self._alike)
            if (at := bisect.bisect_left(run.steps, step)) < len(run) and run.steps[at] == step
        ]
        if not found:
            return _Row()
        i, at = found[0]
        run = self._alike[i]
        before, after = run.cut(at)
        _, after = after.cut(1)
        self._alike[i : i + 1] = [r for r in (before, after) if len(r)]
        return _row_of(run, at)

    def _add_clip(self, record: StepRecord) -> None:
        # grad_norm is what clip_grad_norm_ returned (the norm before clipping), over the
        # parameters it was given; the coefficient is the factor it scaled them by, as torch
        # computes it (1: not clipped).
        assert record.clip_norm is not None
        total = record.clip_norm.values()[0]
        row = self._open[record.step].values
        row["grad_norm"] = total
        if math.isfinite(record.max_norm):
            row["grad_clip_coef"] = min(1.0, record.max_norm / (total + 1e-6))

    def _add_logged(self, record: LogRecord) -> None:
        values, failed = record.resolve()
        row = self._row(record.step)
        if record.source != LOGGED:
            if row.implicit is None:
                row.implicit = {}
            row = row.implicit.setdefault(record.source, _Row())
        for key, value in values.items():
            row.add_logged(key, value)
        self.failures.extend((f"log:{key}", exc) for key, exc in failed)

    def _add_norms(self, records: list[StepRecord]) -> None:
        # Consecutive steps whose values are packed alike (the usual tick: all of them) are
        # unpacked in one numpy pass: per step it would be a dozen calls on the sampler thread.
        for group in alike_groups(records):
            try:
                totals, norms = read_norms(group)
            except Exception as exc:
                if len(group) == 1:
                    self.failures.append(("records:grad_norm", exc))
                else:  # one step's values that cannot be read must not cost the others
                    for record in group:
                        self._add_norms([record])
                continue
            for step, total in zip(norms.steps, totals, strict=True):
                self._open[step].values["grad_norm"] = total
            self.layer_norms.append(norms)

    def _add_step(self, record: StepRecord) -> None:
        # The learning rates are read first: one that cannot be is NaN, not the step's loss.
        lrs = [lr if isinstance(lr, float) else self._read_lr(lr) for lr in record.lrs]
        whole = self._row(record.step)
        row = whole.values
        if record.phases is not None:
            # First in the row, as when they were a record of their own before the step's.
            try:
                row.update(dict(zip(PHASE_KEYS, record.phase_values() or (), strict=True)))
            except Exception as exc:  # the phases only: the step's other values are kept
                self.failures.append(("records:phases", exc))
        row["time"] = record.time
        row["step_time"] = record.step_time
        row["micro_batches"] = float(record.micro_batches)
        if record.skipped:
            row["step_skipped"] = 1.0
        if record.samples:
            row["samples"] = float(record.samples)
            row["samples_per_s"] = (
                record.samples / record.step_time if record.step_time > 0 else math.nan
            )
        if record.tokens:
            row["tokens"] = float(record.tokens)
            row["tokens_per_s"] = (
                record.tokens / record.step_time if record.step_time > 0 else math.nan
            )
        if self.flops is not None:
            row.update(self.flops.step_values(record.tokens, record.samples, record.step_time))
        for i, value in enumerate(lrs):
            row["lr" if i == 0 else f"lr_group{i}"] = value
        self._last_ended = max(self._last_ended, record.step)
        if record.loss is not None:  # mon.log(loss=...) folded in: a LOGGED value
            try:
                loss = record.loss_value()
            except Exception as exc:
                self.failures.append(("log:loss", exc))
            else:
                if loss is not None:
                    whole.add_logged("loss", loss)

    def _read_lr(self, value: Pending) -> float:
        try:
            return value.values()[0]
        except Exception as exc:
            self.failures.append(("records:lr", exc))
            return math.nan

    def take_final(self, everything: bool = False) -> list[dict[str, float]]:
        """Rows that can no longer change (all rows with ``everything``), in step order."""
        return [row for part in self.take(everything) for row in part.rows]

    def take(self, everything: bool = False, ended: bool = False) -> Iterator[StepRows]:
        """The rows that can no longer change, in step order, at most ``TAKE_ROWS`` a part:
        those of steps before the last that ended; with ``ended`` (a flush) that one too; with
        ``everything`` (close) every row, except that a step which never ended (interrupted)
        is dropped when some step did. Taken as the caller iterates (the smoothed loss runs on
        from one part to the next), so that it can hand the GIL over between two; a part not
        reached is taken next time."""
        last = self._last_ended
        if everything and last:
            for step in [s for s in self._open if s > last]:
                del self._open[step]  # an interrupted step's half row
        stale = [s for s in self._open if s <= self._taken_through]
        for step in stale:  # values for a step a flush already wrote
            keys = ", ".join(sorted({*self._open[step].sums, *self._open[step].values}))
            del self._open[step]
            self.failures.append(
                ("records:late", ValueError(f"values for step {step} ({keys}) came after "
                 "mon.flush() had written that step; they are not kept"))
            )  # fmt: skip
        final = sorted(s for s in self._open if everything or s < last or (ended and s == last))
        at = size = 0
        pieces: list[StepRows] = []
        while self._alike or at < len(final):
            run = self._alike[0] if self._alike else None
            # The rows read one by one before the run, then the run up to the next of them.
            upto = len(final) if run is None else bisect.bisect_left(final, run.steps[0], at)
            if at < upto:
                room = max(1, (TAKE_ROWS - size) // ONE_BY_ONE)
                steps = final[at : min(upto, at + room)]
                at += len(steps)
                pieces.append(StepRows([self._finish(s, self._open.pop(s)) for s in steps]))
                size += ONE_BY_ONE * len(steps)
            elif run is not None:
                end = len(run)
                if at < len(final) and final[at] < run.steps[-1]:
                    end = bisect.bisect_left(run.steps, final[at])
                end = min(end, TAKE_ROWS - size)
                if end < len(run):
                    run, self._alike[0] = run.cut(end)
                else:
                    del self._alike[0]
                pieces.append(self._finish_alike(run))
                size += len(run)
            if pieces:
                self._taken_through = max(self._taken_through, pieces[-1].last_step)
            if size >= TAKE_ROWS:
                yield from _joined(pieces)
                pieces, size = [], 0
        if pieces:
            yield from _joined(pieces)

    def _finish_alike(self, run: AlikeSteps) -> StepRows:
        """``_finish`` of every row of ``run``, a column at a time: the rows as columns, no
        dict per row (the smoothed loss is absent from the rows before the first finite
        loss, NaN in its column)."""
        columns = {"step": list(map(float, run.steps)), **run.values, **run.logged()}
        loss = columns.get("loss")
        missing = 0
        if loss is not None:
            ema, weight = self._ema, self._ema_weight
            keep, take = SMOOTHING, 1 - SMOOTHING
            smooth: list[float] = []
            rest: Sequence[float] = loss
            if weight > 0 and math.isfinite(sum(loss)):
                # Every loss finite and a smoothed one already (the usual part): the same
                # operations without the tests a value.
                append = smooth.append
                for value in loss:
                    ema = keep * ema + take * value
                    weight = keep * weight + take
                    append(ema / weight)
                rest = ()
            for value in rest:
                if math.isfinite(value):
                    ema = keep * ema + take * value
                    weight = keep * weight + take
                if weight > 0:
                    smooth.append(ema / weight)
                else:  # no finite loss yet: no smoothed one (only ever the first rows)
                    smooth.append(math.nan)
                    missing += 1
            self._ema, self._ema_weight = ema, weight
            if missing < len(smooth):
                columns["loss_smooth"] = smooth
        for key, column in columns.items():
            if type(column) is not list:  # a column read as an array: the rows hold floats
                columns[key] = np.asarray(column, dtype=np.float64).tolist()
        absent = {"loss_smooth": missing} if missing and "loss_smooth" in columns else None
        return StepRows(ColumnRows(columns, absent), columns)

    def take_failures(self) -> list[tuple[str, Exception]]:
        """What could not be read since the last call, as (source, error)."""
        out, self.failures = self.failures, []
        return out

    def take_groups_added(self) -> list[tuple[int, float, tuple[tuple[int, int, int], ...]]]:
        """The param groups added mid-run since the last call: (step, time, groups_added)."""
        out, self.groups_added = self.groups_added, []
        return out

    def take_layer_blocks(self) -> tuple[list[LayerNorms], list[tuple[AuxRecord, list[float]]]]:
        """The per-layer gradient norms and the auxiliary per-layer values since the last call."""
        out = self.layer_norms, self.aux
        self.layer_norms, self.aux = [], []
        return out

    def take_structure(self) -> list[tuple[int, str, Mapping[str, object]]]:
        """The structural facts since the last call: (step, kind, facts)."""
        out, self.structure = self.structure, []
        return out

    def peek_open(self) -> list[dict[str, float]]:
        """The rows still open, as they stand now (for history() and the header)."""
        ema, weight = self._ema, self._ema_weight
        steps = sorted(self._open)
        if not self._alike:
            rows = [self._finish(s, self._open[s]) for s in steps]
        else:  # not taken (a tick whose store failed): they are shown too, in order
            rows = []
            runs, at = list(self._alike), 0
            while runs or at < len(steps):
                if not runs or (at < len(steps) and steps[at] < runs[0].steps[0]):
                    rows.append(self._finish(steps[at], self._open[steps[at]]))
                    at += 1
                    continue
                end = bisect.bisect_left(runs[0].steps, steps[at]) if at < len(steps) else 0
                if 0 < end < len(runs[0]):
                    run, runs[0] = runs[0].cut(end)
                else:
                    run = runs.pop(0)
                rows += self._finish_alike(run).rows  # a few rows: made here
        self._ema, self._ema_weight = ema, weight
        return rows

    def _finish(self, step: int, row: _Row) -> dict[str, float]:
        out = row.build(step)
        out.setdefault("time", math.nan)
        loss = out.get("loss")
        if loss is not None and math.isfinite(loss):
            self._ema = SMOOTHING * self._ema + (1 - SMOOTHING) * loss
            self._ema_weight = SMOOTHING * self._ema_weight + (1 - SMOOTHING)
        if loss is not None and self._ema_weight > 0:
            out["loss_smooth"] = self._ema / self._ema_weight
        return out


def _row_of(run: AlikeSteps, at: int) -> _Row:
    """Step ``at`` of ``run`` as the row its records read one by one would have made."""
    values = {k: v[at] for k, v in run.values.items()}
    sums = {k: v[at] for k, v in run.sums.items()}
    if run.source == LOGGED or not sums:
        return _Row(values, sums, dict(run.counts) if sums else {})
    return _Row(values, implicit={run.source: _Row(sums=sums, counts=dict(run.counts))})


def _joined(pieces: list[StepRows]) -> list[StepRows]:
    """Consecutive rows as few parts: each run of pieces with the same keys in the same order
    (the alike runs and the steps read record by record amid them, usually) as one part held
    as columns; rows of other keys apart, as they are. No row is made of rows held as
    columns."""
    out: list[StepRows] = []
    group: list[ColumnRows] = []

    def close_group() -> None:
        if group:
            joined = ColumnRows.joined(group)
            assert joined is not None
            out.append(StepRows(joined, joined.columns))
            group.clear()

    for piece in map(_as_columns, pieces):
        rows = piece.rows
        if isinstance(rows, ColumnRows) and not (
            group and (rows.keys != group[0].keys or rows.absent)
        ):
            group.append(rows)
            continue
        close_group()
        if isinstance(rows, ColumnRows):
            group.append(rows)
        elif out and out[-1].columns is None:  # rows of several key sets: one list
            out[-1] = StepRows([*out[-1].rows, *rows])
        else:
            out.append(piece)
    close_group()
    return out


def _as_columns(piece: StepRows) -> StepRows:
    """``piece`` held as columns when every row has the same keys in the same order."""
    rows = piece.rows
    if piece.columns is not None or not rows:
        return piece
    keys = tuple(rows[0])
    if any(len(row) != len(keys) or tuple(row) != keys for row in rows):
        return piece
    columns = {key: [row[key] for row in rows] for key in keys}
    return StepRows(ColumnRows(columns), columns)
