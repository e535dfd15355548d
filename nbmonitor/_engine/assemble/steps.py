"""Turns drained records into per-step rows (sampler thread only).

A step's row is open while values for it may still arrive (``mon.log`` after ``optimizer.step``)
and becomes final once a later step has ended, or at close.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.assemble.spans import phase_columns
from nbmonitor._engine.derive.mfu import StepFlops
from nbmonitor.records import (
    FROM_BACKWARD,
    LOGGED,
    AuxRecord,
    FlopsRecord,
    LogRecord,
    OptimizerRecord,
    Pending,
    PhaseRecord,
    Record,
    StepRecord,
    squared_norms,
    squared_norms_split,
)

# Exponential smoothing of the loss for display (about a 20-step window), debiased like Adam so
# the first points are not pulled towards zero.
SMOOTHING = 0.95


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


@dataclass(frozen=True, slots=True)
class LayerNorms:
    """Per-parameter gradient norms of consecutive steps packed alike, one row per step;
    ``index`` None means every tracked parameter."""

    steps: tuple[int, ...]
    norms: npt.NDArray[np.float64]  # steps x parameters
    index: tuple[int, ...] | None
    finite: npt.NDArray[np.bool_]  # per step: all of its norms are


def _packed_alike(a: StepRecord, b: StepRecord) -> bool:
    # The same layout and index mean the same number of values (NormPass packs them, and
    # hands the same two objects to every step: compared by identity first).
    if a.norms_layout is b.norms_layout and a.norm_index is b.norm_index:
        return True
    return a.norms_layout == b.norms_layout and a.norm_index == b.norm_index


class StepAssembler:
    """Merges StepRecords and LogRecords into one row per step.

    ``device`` names the accelerator (read once a FLOPs count arrives), for the MFU peak.
    """

    def __init__(self, device: Callable[[], str | None] = lambda: None) -> None:
        self._device = device
        # Training FLOPs per token/sample, from the one counted forward; None until it comes.
        self.flops: StepFlops | None = None
        self.optimizer: OptimizerRecord | None = None  # what the monitor's optimizer is
        self._open: dict[int, _Row] = {}
        self._last_ended = 0
        self._ema = 0.0
        self._ema_weight = 0.0
        self.layer_norms: list[LayerNorms] = []
        self.aux: list[tuple[AuxRecord, list[float]]] = []
        # What could not be read since the caller last took it: (source, error), e.g.
        # ("log:acc", ValueError(...)). The rest of each record, and every other record, is kept.
        self.failures: list[tuple[str, Exception]] = []
        # Param groups added mid-run, for the caller to report: (step, time, groups_added).
        self.groups_added: list[tuple[int, float, tuple[tuple[int, int, int], ...]]] = []

    def add(self, records: Sequence[Record]) -> None:
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
                elif isinstance(record, PhaseRecord):
                    self._row(record.step).values.update(phase_columns(record))
                elif isinstance(record, AuxRecord):
                    self.aux.append((record, record.value.values()))
                elif isinstance(record, OptimizerRecord):
                    self.optimizer = record
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
            self._add_clip(record)

    def _row(self, step: int) -> _Row:
        # Not setdefault(step, _Row()): that builds a row (three dicts) for every record of a
        # step whose row exists, three times a step.
        row = self._open.get(step)
        if row is None:
            row = self._open[step] = _Row()
        return row

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
        start = 0
        while start < len(records):
            first = records[start]
            end = start + 1
            while end < len(records) and _packed_alike(first, records[end]):
                end += 1
            group = records[start:end]
            try:
                self._add_norm_group(group)
            except Exception as exc:
                if len(group) == 1:
                    self.failures.append(("records:grad_norm", exc))
                else:  # one step's values that cannot be read must not cost the others
                    for record in group:
                        self._add_norms([record])
            start = end

    def _add_norm_group(self, records: list[StepRecord]) -> None:
        # Reads everything before it changes anything, so that a failure leaves no trace.
        values = [r.norms for r in records if r.norms is not None]
        first = records[0]
        layout = first.norms_layout
        split = values[0].stack_alike(values) if layout is not None else None
        if split is not None and layout is not None:
            squares = squared_norms_split(*split, layout)
        else:
            matrix = np.stack([v.floats() for v in values])
            squares = squared_norms(matrix, layout)
        # The total norm from the per-tensor ones; NaN/Inf in any of them carries through.
        totals = np.sqrt(squares.sum(axis=1)).tolist()
        if layout is None:
            norms = matrix.astype(np.float64, copy=False)
        else:
            norms = np.sqrt(squares, out=squares)
        steps = tuple(record.step for record in records)
        finite = np.all(np.isfinite(norms), axis=1, keepdims=True)[:, 0]
        for step, total in zip(steps, totals, strict=True):
            self._open[step].values["grad_norm"] = total
        self.layer_norms.append(LayerNorms(steps, norms, first.norm_index, finite))

    def _add_step(self, record: StepRecord) -> None:
        # The learning rates are read first: one that cannot be is NaN, not the step's loss.
        lrs = [lr if isinstance(lr, float) else self._read_lr(lr) for lr in record.lrs]
        row = self._row(record.step).values
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

    def _read_lr(self, value: Pending) -> float:
        try:
            return value.values()[0]
        except Exception as exc:
            self.failures.append(("records:lr", exc))
            return math.nan

    def take_final(self, everything: bool = False) -> list[dict[str, float]]:
        """Rows that can no longer change (all rows with ``everything``), in step order."""
        return self.take_rows(self.final_steps(everything))

    def final_steps(self, everything: bool = False) -> list[int]:
        """The steps whose rows can no longer change (all with ``everything``), in order."""
        return sorted(s for s in self._open if everything or s < self._last_ended)

    def take_rows(self, steps: Sequence[int]) -> list[dict[str, float]]:
        """The rows of ``steps`` (from ``final_steps``, taken in its order, in as many parts
        as the caller likes: the smoothed loss runs on from one part to the next)."""
        return [self._finish(s, self._open.pop(s)) for s in steps]

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

    def peek_open(self) -> list[dict[str, float]]:
        """The rows still open, as they stand now (for history() and the header)."""
        ema, weight = self._ema, self._ema_weight
        rows = [self._finish(s, self._open[s]) for s in sorted(self._open)]
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
