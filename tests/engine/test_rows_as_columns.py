"""A tick's steps go downstream as columns (``runs.column_rows.ColumnRows``): from the alike
runs the records stage read, through the column cap, the store, the span log and the outbox,
to the run log (its bytes written from the columns) and the writer process's pickle, with no
dict made per row; a sink that reads rows gets each row as the dict it would have been."""

from __future__ import annotations

import math
import pathlib
import pickletools
from typing import Any

import numpy as np
import pytest

from nbmonitor._engine.assemble.spans import SpanLog
from nbmonitor._engine.assemble.steps import StepAssembler
from nbmonitor._engine.column_cap import ColumnCap
from nbmonitor._engine.outbox import Outbox
from nbmonitor._engine.run_model import RunModel
from nbmonitor.records import PHASES, StepRecord
from nbmonitor.runs import open_run
from nbmonitor.runs.column_rows import ColumnRows, RowParts
from nbmonitor.runs.format import encode_lines
from nbmonitor.sinks import RunLogSink, writer


def step_records(first: int, last: int, nan_first: int = 0) -> list[StepRecord]:
    """One record a step, as a fast loop makes them: phases and the loss folded in (the
    first ``nan_first`` losses NaN: no smoothed loss in their rows)."""
    return [
        StepRecord(
            step=s,
            time=1000.0 + s * 0.01,
            step_time=0.01 + (s % 7) * 1e-4,
            samples=8,
            micro_batches=1,
            lrs=(1e-3,),
            phases=tuple(0.001 * (i + 1) + s * 1e-7 for i in range(len(PHASES))),
            loss=math.nan if s < first + nan_first else 1.0 / s,
        )
        for s in range(first, last + 1)
    ]


class Made:
    """Counts the rows made of rows held as columns (a dict each)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        iterate, get = ColumnRows.__iter__, ColumnRows.__getitem__

        def counted_iter(held: ColumnRows) -> Any:
            for row in iterate(held):
                self.rows += 1
                yield row

        def counted_get(held: ColumnRows, index: Any) -> Any:
            got = get(held, index)
            self.rows += isinstance(got, dict)
            return got

        monkeypatch.setattr(ColumnRows, "__iter__", counted_iter)
        monkeypatch.setattr(ColumnRows, "__getitem__", counted_get)


def test_a_tick_of_a_thousand_alike_steps_reaches_the_run_log_without_a_dict_per_row(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = Made(monkeypatch)
    assembler, model, cap = StepAssembler(), RunModel(), ColumnCap()
    model.outbox.open()
    for _ in assembler.feed(step_records(1, 1001, nan_first=3)):
        pass
    for part in assembler.take():  # as the pipeline's collect stores them
        assert isinstance(part.rows, ColumnRows) and part.columns is part.rows.columns
        model.add_step_rows(*cap.filter_columns(part.rows, part.columns), logged=part.rows)
    assert len(model.steps) == 1000 and model.spans.gantt()  # stored, the gantt's rows kept
    batch = model.take_batch()
    steps = batch.streams["steps"]
    assert isinstance(steps, ColumnRows) and len(steps) == 1000  # one batch of columns
    sink = RunLogSink.create(tmp_path, "cols", {})
    sink.write(batch)
    sink.flush()
    message = writer.dumps(("write", dict(batch.streams)))  # what the writer process is sent
    assert sum(op.name == "EMPTY_DICT" for op, _, _ in pickletools.genops(message)) < 5
    assert made.rows <= 3  # the gantt's last steps: no dict per row on the way
    sink.close()
    rows = list(steps)  # a sink that reads rows: each made as it reads it
    assert "loss_smooth" not in rows[2] and rows[3]["loss_smooth"] == rows[3]["loss"]
    assert (sink.path / "steps.jsonl").read_bytes() == encode_lines(rows)
    history = open_run(sink.path).history()
    assert history["step"].tolist() == [float(s) for s in range(1, 1001)]
    np.testing.assert_array_equal(history["loss_smooth"], model.steps.history()["loss_smooth"])


def test_the_same_ticks_read_as_columns_or_record_by_record_write_the_same_bytes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbmonitor._engine.assemble import alike

    def run(name: str) -> bytes:
        assembler, model = StepAssembler(), RunModel()
        model.outbox.open()
        sink = RunLogSink.create(tmp_path, name, {})
        records = step_records(1, 700, nan_first=2)
        ticks = (records[:250], records[250:251], records[251:])
        for i, tick in enumerate(ticks):
            for _ in assembler.feed(tick):
                pass
            for part in assembler.take(ended=i == len(ticks) - 1):
                model.add_step_rows(part.rows, part.columns)
            sink.write(model.take_batch())
        sink.close()
        return (sink.path / "steps.jsonl").read_bytes()

    by_columns = run("columns")
    monkeypatch.setattr(
        alike, "plan", lambda records, open_steps=(): [alike.Segment(0, len(records))]
    )
    assert by_columns == run("rows") and by_columns.count(b"\n") == 700


def test_the_outbox_keeps_rows_held_as_columns_in_order_once_and_bounded() -> None:
    box = Outbox(limit=5)
    box.open()
    box.put("steps", ColumnRows({"step": [1.0, 2.0], "loss": [0.5, 0.25]}))
    box.put("steps", [{"step": 3.0}])
    box.put("steps", ColumnRows({"step": [4.0, 5.0, 6.0], "loss": [0.1, 0.2, 0.3]}))
    assert box.waiting("steps") == 5 and box.take_dropped() == {"steps": 1}
    got = box.take().streams["steps"]
    assert isinstance(got, RowParts) and [r["step"] for r in got] == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert got[0] == {"step": 2.0, "loss": 0.25}
    assert not box.take()
    # Parts of one key set come as one ColumnRows; bounded past the limit inside a part too.
    box.put("steps", ColumnRows({"step": [7.0, 8.0]}))
    box.put("steps", ColumnRows({"step": [9.0, 10.0, 11.0, 12.0, 13.0]}))
    got = box.take().streams["steps"]
    assert isinstance(got, ColumnRows) and got.columns == {"step": [9.0, 10.0, 11.0, 12.0, 13.0]}
    assert box.dropped == {"steps": 3}


def test_the_span_logs_gantt_is_the_same_from_columns_and_from_rows() -> None:
    keys = ["step", "time", "step_time", *(f"phase_{p}_s" for p in PHASES)]
    columns = {k: [float(i + j) for i in range(100)] for j, k in enumerate(keys)}
    held = ColumnRows(columns)
    by_columns, by_rows = SpanLog(), SpanLog()
    arrays = {k: np.asarray(v) for k, v in columns.items()}
    by_columns.add_steps(held[:60], {k: v[:60] for k, v in arrays.items()})
    by_columns.add_steps(held[60:], {k: v[60:] for k, v in arrays.items()})
    by_rows.add_steps(list(held[:60]))
    by_rows.add_steps(list(held[60:]))
    assert by_columns.gantt() == by_rows.gantt() and by_columns.gantt(5) == by_rows.gantt(5)
    assert by_columns.summary() == by_rows.summary()
