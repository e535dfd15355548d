"""Counted guards of the records stage's fixed cost a tick (issue 39): what a tick does that
does not depend on the machine's load."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from nbmonitor._engine.assemble import alike
from nbmonitor._engine.assemble.steps import StepAssembler
from nbmonitor._engine.handover import SLICE
from nbmonitor.records import NormLayout, StructureRecord, squared_norms_split


def test_records_that_make_no_row_are_added_without_planning_alike_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sampled steps' records beside a block of steps (a tiny tick brings ~55): no step's
    # row among them, so no alike run to plan (alike.plan over them found none).
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("alike.plan called for records that make no row")

    monkeypatch.setattr(alike, "plan", refuse)
    records = [
        StructureRecord(100 * (i // 3 + 1), ("forward", "backward", "pre_step")[i % 3], ())
        for i in range(3 * SLICE + 5)
    ]
    assembler = StepAssembler()
    slices = list(assembler.feed(records))
    assert [len(s) for s in slices] == [SLICE, SLICE, SLICE, 5]
    assert [fact[:2] for fact in assembler.take_structure()] == [(r.step, r.kind) for r in records]


def test_the_raw_values_are_squared_in_pieces_not_as_one_matrix() -> None:
    # mlp50's tick: 46 steps of 51 biases of 64 values (3,210 raw values a step). Squared
    # whole, the squares were a 590 KB float32 matrix (and more, made in float64); in pieces
    # the temporaries are ~250 KB whatever the tick's length.
    rng = np.random.default_rng(0)
    starts = tuple(range(0, 51 * 64, 64))
    layout = NormLayout(squared=0, norms=51, starts=starts)
    tail = rng.standard_normal((46, 51 + 51 * 64)).astype(np.float32)
    head = np.empty((46, 0))
    squared_norms_split(head, tail, layout)  # numpy's first-call allocations out of the way
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = squared_norms_split(head, tail, layout)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert out.shape == (46, 102)
    assert peak < 450_000, peak  # the raw values alone are 601,944 bytes; whole, 1.84 MB
