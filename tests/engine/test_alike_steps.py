"""Runs of alike steps read as columns (``assemble/alike.py``) give exactly what reading every
record one by one gives: the same rows (keys, key order, values, types), the same history in
the store, the same bytes in steps.jsonl, the same failures and layer norms; over random
mixes of alike runs and irregular steps, cut into ticks anywhere."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from nbmonitor._engine.assemble import alike, step_norms
from nbmonitor._engine.assemble.alike import Segment
from nbmonitor._engine.assemble.steps import StepAssembler, StepRows
from nbmonitor._engine.column_cap import ColumnCap
from nbmonitor._engine.run_model import RunModel
from nbmonitor.memory import MemoryBreakdown
from nbmonitor.records import (
    FROM_BACKWARD,
    FROM_OUTPUT,
    LOGGED,
    AuxRecord,
    FlopsRecord,
    LogRecord,
    MemoryRecord,
    OptimizerRecord,
    Record,
    SpanRecord,
    StepRecord,
)
from nbmonitor.runs.encode import LineEncoder
from nbmonitor.runs.format import encode_lines


class Value:
    """A ``records.Pending`` of the test's own: values read already, or that fail to read."""

    def __init__(self, values: Sequence[float], fail: bool = False) -> None:
        self._values = [float(v) for v in values]
        self._fail = fail

    def ready(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def values(self) -> list[float]:
        if self._fail:
            raise ValueError("cannot be read")
        return list(self._values)

    def floats(self) -> np.ndarray:
        return np.array(self.values())

    def array(self) -> np.ndarray:
        return np.array(self.values())

    def stack_alike(self, values: Sequence[Any]) -> None:
        return None


LOSSES = (0.5, -0.0, 0.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, 2.0**60)
# A log source of the test's own: mon.log(loss=...) folded into the StepRecord (its ``loss``).
FOLDED = -1


class Loop:
    """Records as a training loop makes them: runs of steps alike in a random style (which
    records, which keys, which sources), irregular steps between them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.step = 0
        self.new_style()

    def new_style(self) -> None:
        rng = self.rng
        self.style = {
            # A step's phases are in its StepRecord (None: phases off).
            "phase": rng.choice(["in", "in", "in", None]),
            "pending_phase": rng.random() < 0.2,
            "norms": rng.choice([None, 3, 3, 5]),
            "clip": rng.choice([None, None, 1.0, math.inf]),
            "samples": rng.choice([0, 8]),
            "tokens": rng.choice([0, 0, 64]),
            "lrs": rng.choice([0, 1, 1, 2]),
            "pending_lr": rng.random() < 0.15,
            "logs": rng.choice(
                [
                    [],
                    [(LOGGED, ("loss",))],
                    [(FOLDED, ("loss",))],
                    [(FOLDED, ("loss",))],
                    [(LOGGED, ("acc",)), (FOLDED, ("loss",))],
                    [(FOLDED, ("loss",)), (LOGGED, ("acc",))],
                    [(LOGGED, ("loss",)), (FOLDED, ("loss",))],  # one before the step's end
                    [(FOLDED, ("loss",)), (FROM_BACKWARD, ("loss",))],  # not alike: exact
                    [(LOGGED, ("loss",))],
                    [(LOGGED, ("loss", "acc"))],
                    [(LOGGED, ("loss",)), (LOGGED, ("loss",))],  # accumulation: averaged
                    [(LOGGED, ("acc",)), (LOGGED, ("loss", "acc"))],
                    [(FROM_BACKWARD, ("loss",))],
                    [(FROM_BACKWARD, ("loss",)), (FROM_BACKWARD, ("loss",))],  # summed
                    [(FROM_OUTPUT, ("loss",)), (FROM_OUTPUT, ("loss",))],
                    [(FROM_OUTPUT, ("loss",)), (FROM_BACKWARD, ("loss",))],  # precedence
                    [(LOGGED, ("loss",)), (FROM_BACKWARD, ("loss",))],
                ]
            ),
            "tensor_log": rng.random() < 0.3,
            "span": rng.random() < 0.2,
            "bad_losses": rng.random() < 0.2,
        }

    def value(self, bad: bool) -> float:
        rng = self.rng
        return rng.choice(LOSSES) if bad and rng.random() < 0.5 else rng.uniform(0.1, 3.0)

    def records(self, steps: int) -> list[Record]:
        out: list[Record] = []
        for _ in range(steps):
            if self.rng.random() < 0.04:
                self.new_style()
            self.step += 1
            out += self.one_step(irregular=self.rng.random() < 0.08)
        return out

    def one_step(self, irregular: bool) -> list[Record]:
        rng, style, step = self.rng, self.style, self.step
        fail = irregular and rng.random() < 0.3  # one value of this step cannot be read
        out: list[Record] = []
        if style["span"]:
            out.append(SpanRecord("data", step, 1.0 * step, 0.001))
        if irregular and rng.random() < 0.3:
            out.append(AuxRecord(step, "update", ("a", "b"), Value([1.0, 2.0])))
            out.append(MemoryRecord(MemoryBreakdown(rows=(), step=step)))
        durations = tuple(rng.uniform(0, 0.01) for _ in range(5))
        if irregular and rng.random() < 0.2:
            durations = durations[:4]  # phases that cannot be read
        phases: Any = (
            Value(durations, fail and rng.random() < 0.3) if style["pending_phase"] else durations
        )
        if style["phase"] is None or (irregular and rng.random() < 0.1):
            phases = None
        lrs: list[Any] = [rng.choice([1e-3, 2e-3]) for _ in range(style["lrs"])]
        if style["pending_lr"] and lrs:
            lrs[0] = Value([lrs[0]], fail and rng.random() < 0.3)
        norms = None
        if style["norms"]:
            values = [rng.uniform(0, 2) for _ in range(style["norms"])]
            if irregular and rng.random() < 0.2:
                values[0] = math.inf
            norms = Value(values, fail and rng.random() < 0.3)
        clip = (
            None
            if style["clip"] is None
            else Value([rng.uniform(0, 3)], fail and rng.random() < 0.2)
        )
        record = StepRecord(
            step=step,
            time=1000.0 + step * 0.01,
            step_time=rng.uniform(0.01, 0.02) if not (irregular and rng.random() < 0.2) else 0.0,
            samples=style["samples"],
            micro_batches=len(style["logs"]) or 1,
            lrs=tuple(lrs),
            norms=norms,
            clip_norm=clip,
            max_norm=style["clip"] if style["clip"] is not None else math.nan,
            skipped=irregular and rng.random() < 0.1,
            groups_added=((1, 2, 0),) if irregular and rng.random() < 0.05 else (),
            tokens=style["tokens"] if not (irregular and rng.random() < 0.2) else 0,
            phases=phases,
        )
        # The values logged before the step's end come before its record, those after it
        # (held with it, Recorder.hold) after, but for the loss folded into it.
        logs = style["logs"]
        folded = next((i for i, (source, _) in enumerate(logs) if source == FOLDED), len(logs))
        if irregular and rng.random() < 0.1:
            folded = len(logs)  # a loss not folded this once (logged twice, say)
        for i, (source, keys) in enumerate(logs):
            if i == folded:
                loss = self.value(style["bad_losses"])
                if style["tensor_log"]:
                    record.loss = Value([loss], fail and rng.random() < 0.3)
                else:
                    record.loss = loss
                out.append(record)
                continue
            log = LogRecord(step, source=LOGGED if source == FOLDED else source)
            if style["tensor_log"]:
                log.tensors.append((keys, Value([self.value(style["bad_losses"]) for _ in keys])))
            else:
                log.numbers.update((k, self.value(style["bad_losses"])) for k in keys)
            out.append(log)
        if folded == len(logs):
            out.insert(len(out) - len(logs), record)
        if irregular:
            what = rng.randrange(6)
            if what == 0:  # mon.log of an extra key, once
                out.append(LogRecord(step, numbers={"val_acc": rng.random()}))
            elif what == 1:  # a value that could not be read at the call
                out.append(
                    LogRecord(step, numbers={"loss": 1.0}, dropped=(("acc", ValueError("x")),))
                )
            elif what == 2 and out[-1].step == step:  # a log tensor that fails on the sampler
                out.append(LogRecord(step, tensors=[(("loss",), Value([1.0], fail=True))]))
            elif what == 3 and step > 3:  # a late value for an earlier step
                out.append(LogRecord(step - rng.randint(1, 3), numbers={"late": 1.0}))
            elif what == 4:
                out.append(
                    FlopsRecord(step, forward_flops=1e9, tokens=64, samples=8, dtype="bfloat16")
                )
            else:
                out.append(OptimizerRecord(step, "SGD", "cpu", "for-loop", False, True))
        return out


def _exact(records: Sequence[Record], open_steps: Any = ()) -> list[Segment]:
    return [Segment(0, len(records))] if records else []


def run(
    ticks: list[list[Record]],
    limit: int,
    untaken: set[int] = set(),  # noqa: B006
    device: str | None = None,
) -> dict[str, Any]:
    """What the records stage makes of ``ticks``: as the pipeline feeds and takes them; after
    the ticks in ``untaken`` it takes nothing (its store failed), so rows read in alike runs
    wait for the next, and a late record of one of their steps joins it."""
    assembler = StepAssembler(device=lambda: device)  # a known device: MFU is a number
    model, cap = RunModel(), ColumnCap(limit)
    encoder = LineEncoder()
    rows: list[str] = []
    jsonl = b""
    peeks: list[list[str]] = []
    seen: list[Record] = []
    for i, tick in enumerate(ticks):
        for part in assembler.feed(tick):
            seen += part
        last = i == len(ticks) - 1
        for part in assembler.take(everything=last) if i not in untaken else ():
            rows += [repr(list(r.items())) for r in part.rows]
            jsonl += encode_lines(part.rows)  # steps.jsonl's bytes
            # The run log's encoder, from the columns when the rows are held so: those bytes.
            assert encoder.encode(part.rows)[0] == encode_lines(part.rows)
            if part.columns is not None:
                check_columns(part)
                kept, columns = cap.filter_columns(part.rows, part.columns)
            else:
                kept, columns = cap.filter(part.rows), None
            model.add_step_rows(kept, columns)
        peeks.append([repr(list(r.items())) for r in assembler.peek_open()])
    assert seen == [r for tick in ticks for r in tick]  # every record once, in order
    blocks, aux = assembler.take_layer_blocks()
    history = model.steps.history()
    return {
        "rows": rows,
        "jsonl": jsonl,
        "peeks": peeks,
        # In the order of the slices: what failed in a step, not when, is the same.
        "failures": sorted((source, repr(exc)) for source, exc in assembler.take_failures()),
        "groups_added": assembler.take_groups_added(),
        "layer_steps": [s for b in blocks for s in b.steps],
        "layer_norms": [repr(r) for b in blocks for r in b.norms.tolist()],
        "aux": [(a.step, repr(v)) for a, v in aux],
        "history": {k: repr(v.tolist()) for k, v in history.items()},  # NaN, -0.0 compared
        "last": {k: repr(model.steps.last(k)) for k in model.steps.columns},
        "best": repr(model.best_loss),
        "flops": assembler.flops,
    }


def check_columns(part: StepRows) -> None:
    assert part.columns is not None
    keys = list(part.columns)
    for i, row in enumerate(part.rows):
        assert list(row) == keys or [*row, "loss_smooth"] == keys
        for key in row:
            assert repr(row[key]) == repr(part.columns[key][i])


def cut(records: list[Record], rng: random.Random) -> list[list[Record]]:
    points = sorted(rng.sample(range(1, len(records)), rng.randint(1, 12)))
    return [records[a:b] for a, b in zip([0, *points], [*points, len(records)], strict=True)]


@pytest.mark.parametrize("seed", range(40))
def test_alike_runs_read_as_columns_give_what_records_read_one_by_one_give(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    loop = Loop(seed)
    records = loop.records(rng.randint(50, 600))
    ticks = cut(records, rng)
    untaken = {i for i in range(len(ticks) - 1) if rng.random() < 0.3}
    limit = rng.choice([128, 128, 12])  # a cap that cuts columns, sometimes
    device = rng.choice([None, "NVIDIA H100 80GB HBM3"])
    read, alike_steps = alike.read, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        got = read(*args, **kwargs)
        alike_steps.append(0 if got is None else len(got))
        return got

    monkeypatch.setattr(alike, "read", counted)
    fast = run(ticks, limit, untaken, device)
    assert sum(alike_steps) > 0  # most steps, in fact: irregular ones are frequent here
    monkeypatch.setattr(alike, "plan", _exact)
    exact = run(ticks, limit, untaken, device)
    assert fast == exact


def test_the_usual_loop_is_read_as_columns_but_for_its_edges() -> None:
    loop = Loop(0)
    loop.style.update(phase="in", pending_phase=False, norms=3, clip=None, samples=8,
                      tokens=0, lrs=1, pending_lr=False, logs=[(FOLDED, ("loss",))],
                      tensor_log=False, span=False, bad_losses=False)  # fmt: skip
    records: list[Record] = []
    for _ in range(100):
        loop.step += 1
        records += loop.one_step(irregular=False)
    assert len(records) == 100  # one record a step: its phases and loss folded in
    # Every step in one alike run, the last one's row held open (mon.log may add to it).
    assert alike.plan(records) == [Segment(0, 100, 1, open_last=True)]
    assembler = StepAssembler()
    assert sum(len(part) for part in assembler.feed(records)) == 100
    assert list(assembler._open) == [100]
    rows = [row for part in assembler.take() for row in part.rows]
    assert len(rows) == 99 and list(rows[0])[:3] == ["step", "phase_data_s", "phase_forward_s"]
    assert rows[-1]["loss"] == records[98].loss  # type: ignore[union-attr]
    # A row already open, or a record of a step out of its place, is read one by one.
    assert alike.plan(records, {1: None})[0] == Segment(0, 1)
    late = LogRecord(50, numbers={"late": 1.0})
    segments = alike.plan([*records[:70], late, *records[70:]])
    assert segments[0] == Segment(0, 49, 1) and segments[1].width == 0
    # A step with one record more (here the optimizer's) is not alike the steps around it.
    optimizer = OptimizerRecord(60, "SGD", "cpu", "for-loop", False, True)
    segments = alike.plan([*records[:60], optimizer, *records[60:]])
    assert [(s.start, s.end, s.width) for s in segments] == [
        (0, 59, 1), (59, 61, 0), (61, 101, 1)
    ]  # fmt: skip


def test_norms_of_many_steps_stack_as_numpy_stacks_them() -> None:
    rows = [np.arange(4, dtype=np.float32) + i for i in range(5)] + [np.ones(4)]
    stacked = step_norms._stacked(rows)
    assert stacked.dtype == np.float64 and np.array_equal(stacked, np.stack(rows))
    assert step_norms._stacked([np.empty(0)] * 3).shape == (3, 0)
    with pytest.raises(ValueError, match="different lengths"):  # never one row's values cut
        step_norms._stacked([np.ones(3), np.ones(5), np.ones(4), np.ones(4)])
