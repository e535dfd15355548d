"""The sampler hands the GIL over between bounded slices of its work (issue 29).

Counted, not timed: how many records and rows a scheduled tick handles between two
hand-overs, on any machine. And the numbers are those of unsliced work.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._engine import handover
from nbmonitor._engine.assemble import alike
from nbmonitor._engine.assemble.steps import ALIKE_SLICE, TAKE_ROWS, StepAssembler
from nbmonitor._engine.handover import HandOver
from nbmonitor._engine.run_model import RunModel

STEPS = 1200  # more than two parts of rows (TAKE_ROWS) and many slices of records


def test_slices_keep_order_and_size_and_pause_only_in_a_scheduled_tick():
    pauses: list[int] = []
    seen: list[int] = []
    cut = HandOver(size=3, pause=lambda: pauses.append(len(seen)))
    for part in cut.slices(range(8)):
        seen.extend(part)
    assert seen == list(range(8)) and pauses == []  # flush, close: nobody to let in
    seen.clear()
    with cut.scheduled():
        for part in cut.slices(range(8)):
            assert len(part) <= 3
            seen.extend(part)
        cut()
    cut()  # after the tick: nothing
    assert seen == list(range(8))
    assert pauses == [3, 6, 8]
    assert list(cut.slices([])) == []


def test_slice_size_must_be_positive():
    with pytest.raises(ValueError, match="size must be at least 1"):
        HandOver(size=0)


def test_the_pause_sleeps_as_long_as_the_slice_before_it_ran_within_bounds():
    cpu = [0.0]
    slept: list[float] = []
    pause = handover.Pause(cpu_clock=lambda: cpu[0], sleep=slept.append)
    pause()  # nothing ran before: the shortest
    for ran in (0.0003, 0.0, 0.5):
        cpu[0] += ran
        pause()
    assert slept == [handover.PAUSE_S, 0.0003, handover.PAUSE_S, handover.MAX_PAUSE_S]
    assert 0 < handover.PAUSE_S < handover.MAX_PAUSE_S <= 0.005  # under the switch interval


def run(model: torch.nn.Module, tmp: Any, steps: int = STEPS) -> Any:
    """A monitor whose sampler never ticks by itself; the test ticks it. The caller keeps
    ``model``: a monitor whose model is gone closes itself."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=str(tmp), display=False, interval=3600.0)
    torch.manual_seed(1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
    return mon


def test_a_scheduled_tick_handles_at_most_a_slice_of_records_between_hand_overs(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
):
    torch.manual_seed(0)
    model = mlp()
    mon = run(model, tmp_path)
    try:
        assert not mon.internals.closed
        pipeline = mon.internals.pipeline
        held = int(mon.internals.clock().recorder.held_step() >= 0)
        # Records read one by one count SLICE to a slice; those of alike runs, read as columns
        # (assemble/alike.py), ALIKE_SLICE.
        share = ALIKE_SLICE // handover.SLICE
        work = {"records": 0, "rows": 0}
        most = {"records": 0, "rows": 0}
        total = {"records": 0, "rows": 0, "alike": 0}
        pauses = [0]

        def pause() -> None:
            pauses[0] += 1
            for kind in work:
                most[kind] = max(most[kind], work[kind])
                work[kind] = 0

        add, add_rows, read = StepAssembler.add, RunModel.add_step_rows, alike.read
        read_columns = alike.read_columns

        def counted_add(self: StepAssembler, records: list[Any]) -> None:
            work["records"] += share * len(records)
            total["records"] += len(records)
            add(self, records)

        def counted_read(records: list[Any], *args: Any) -> Any:
            got = read(records, *args)
            if got is not None:
                work["records"] += len(records)
                total["records"] += len(records)
                total["alike"] += len(records)
            return got

        def counted_columns(cols: Any, *args: Any) -> Any:
            # Steps written as columns (records.StepColumns): a row counts as a record of an
            # alike run.
            got = read_columns(cols, *args)
            if got is not None:
                work["records"] += len(cols)
                total["records"] += len(cols)
                total["alike"] += len(cols)
            return got

        def counted_rows(self: RunModel, rows: Any, columns: Any = None, **kw: Any) -> None:
            work["rows"] += len(rows)
            total["rows"] += len(rows)
            add_rows(self, rows, columns, **kw)

        monkeypatch.setattr(StepAssembler, "add", counted_add)
        monkeypatch.setattr(alike, "read", counted_read)
        monkeypatch.setattr(alike, "read_columns", counted_columns)
        monkeypatch.setattr(RunModel, "add_step_rows", counted_rows)
        pipeline.hand_over.pause = pause
        pipeline.tick(paced=True)
        pause()
        # A record or more per step, most of them in alike runs: many slices' worth.
        assert total["records"] >= STEPS > 4 * handover.SLICE
        assert total["alike"] > total["records"] // 2
        # The last step's row stays open, and the step before it too while the last one's
        # record is held for its loss (Recorder.hold: not a sampled step's, as step 400 is).
        assert total["rows"] == STEPS - 1 - held
        assert 0 < most["records"] <= ALIKE_SLICE
        assert 0 < most["rows"] <= TAKE_ROWS < STEPS
        assert pauses[0] >= total["records"] // ALIKE_SLICE + total["rows"] // TAKE_ROWS
    finally:
        mon.close()


KEPT = ("step", "loss", "loss_smooth", "grad_norm", "lr", "micro_batches")


def test_sliced_work_gives_the_numbers_of_unsliced_work(tmp_path: Any):
    columns, layers = [], []
    for size in (1, 10**9):
        torch.manual_seed(0)
        model = mlp()
        mon = run(model, tmp_path / str(size), steps=120)
        try:
            mon.internals.pipeline.hand_over.size = size
            mon.internals.pipeline.tick(paced=True)
            mon.flush()
            history = mon.history()
            columns.append({k: history[k] for k in KEPT})
            layers.append([(r["name"], r["grad_norm"]) for r in mon.layers()])
        finally:
            mon.close()
    for key in KEPT:
        np.testing.assert_array_equal(columns[0][key], columns[1][key], err_msg=key)
    assert len(columns[0]["step"]) == 120
    assert layers[0] == layers[1] and layers[0]


def test_a_scheduled_tick_does_not_wait_for_the_run_log_but_flush_does(tmp_path: Any):
    torch.manual_seed(0)
    model = mlp()
    mon = run(model, tmp_path, steps=20)
    try:
        assert not mon.internals.closed
        writer = mon.internals.pipeline.sources.runlog
        writer.timeout = 60.0  # slow, not hung, however loaded the machine
        runlog, release = mon.internals.runlog, threading.Event()
        write = runlog.write

        def slow(batch: Any) -> None:
            release.wait(60.0)
            write(batch)

        runlog.write = slow
        mon.internals.pipeline.tick(paced=True)
        # The tick handed its rows over and returned while they are being written.
        assert writer.busy and not release.is_set()
        timer = threading.Timer(0.2, release.set)
        timer.start()
        try:
            assert mon.flush()  # waits for that write, then writes its own rows
        finally:
            timer.join()
        assert not writer.busy
        on_disk = nbmonitor.open(mon.run_dir).history()["step"].tolist()
        assert on_disk == list(range(1, 21))  # a flush takes every step that ended
        assert not mon.errors
    finally:
        mon.close()
