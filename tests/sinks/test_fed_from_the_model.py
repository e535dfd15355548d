"""A live run's sinks are fed from the run model's outbox (``_engine/outbox.py``): every row
the model took reaches every sink once, in order, across ticks and flushes; a sink that fails
once loses only the rows it refused and gets no row twice; while the run log hangs the rows
wait bounded, and each row is written once or dropped and counted, never both."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import torch
from tests.helpers import WAIT_S, mlp, train

import nbmonitor
import nbmonitor._engine.outbox as outbox_module
from nbmonitor.errors import Guard
from nbmonitor.sinks import Batch


class Recording:
    """A sink that keeps each batch it is given; ``fail_on``: the writes (1-based) it refuses
    by raising, keeping nothing of them."""

    def __init__(self, name: str, fail_on: tuple[int, ...] = ()) -> None:
        self.name = name
        self.fail_on = fail_on
        self.writes = 0
        self.batches: list[Batch] = []
        self.refused: list[Batch] = []

    def write(self, batch: Batch) -> None:
        self.writes += 1
        if self.writes in self.fail_on:
            self.refused.append(batch)
            raise OSError(f"{self.name} refused write {self.writes}")
        self.batches.append(batch)

    def flush(self) -> None:
        pass

    def close(self, final_meta: Any) -> None:
        pass

    def steps(self, batches: list[Batch] | None = None) -> list[float]:
        return [
            float(row["step"])  # type: ignore[arg-type]
            for batch in (self.batches if batches is None else batches)
            for row in batch.streams.get("steps", ())
        ]


def join(mon: Any, sink: Recording) -> None:
    """Add ``sink`` to the live pipeline's FanOut, behind its own guard, as an exporter is."""
    fan = mon.internals.sinks
    fan.sinks.append(sink)
    fan.guards.append(Guard(f"sink:{sink.name}", mon.errors_log))


def test_rows_taken_between_ticks_reach_every_sink_once_and_in_order(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # A short interval: scheduled ticks take rows between the flushes too.
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.01)
    clean, flaky = Recording("clean"), Recording("flaky", fail_on=(2,))
    join(mon, clean)
    join(mon, flaky)
    try:
        for _ in range(8):
            train(model, opt, mon, 5)
            assert mon.flush(timeout=WAIT_S)
    finally:
        mon.close()
    everything = [float(s) for s in range(1, 41)]
    assert clean.steps() == everything  # none missed, none doubled, in order
    # Each batch holds the rows since the one before: no row in two of them.
    seen = [clean.steps([b]) for b in clean.batches]
    assert sum(map(len, seen)) == len({s for part in seen for s in part}) == 40
    # The sink that refused its second write lost that batch's rows alone, and got the rest
    # once: what it kept and what it refused are the run, each row once.
    assert len(flaky.refused) == 1 and flaky.writes > 2
    assert sorted(flaky.steps() + flaky.steps(flaky.refused)) == everything
    assert len(set(flaky.steps())) == len(flaky.steps())
    assert sum("sink:flaky" in e for e in mon.errors) == 1
    assert not any("sink:clean" in e for e in mon.errors)
    # The other streams alike: what the clean sink got is what the run folder holds.
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == everything
    for stream in ("system", "events", "layers", "spans"):
        got = [row for batch in clean.batches for row in batch.streams.get(stream, ())]
        assert len(got) == len(run.records(stream)), stream
    assert len(run.records("system")) > 0 and len(run.records("layers")) > 0


def _wait_for(predicate: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert predicate()


def test_while_the_run_log_hangs_rows_wait_bounded_each_written_once_or_counted_dropped(
    tmp_path: Any, monkeypatch: Any
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_WAITING_ROWS", 8)
    monkeypatch.setattr("nbmonitor.live.monitor.CLOSE_WAIT_S", 0.5)
    release = threading.Event()
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    try:
        train(model, opt, mon, 3)
        assert mon.flush(timeout=WAIT_S)
        runlog = mon.internals.runlog
        write = runlog.write

        def hung(batch: Batch) -> None:
            release.wait(WAIT_S)
            write(batch)

        monkeypatch.setattr(runlog, "write", hung)
        train(model, opt, mon, 2)
        _wait_for(lambda: mon.status.startswith("degraded: run log writing hung for"))
        outbox = mon.internals.pipeline.model.outbox
        for _ in range(5):
            train(model, opt, mon, 6)
            assert mon.flush(timeout=WAIT_S)  # the rest of the tick goes on; rows wait
            assert outbox.waiting("steps") <= 8 and outbox.waiting("system") <= 8
    finally:
        mon.close()
        release.set()
    said = [e for e in mon.errors if "rows dropped: the sinks did not take them" in e]
    assert len(said) == 1  # once a spell, not once a tick
    in_all = [e for e in mon.errors if "rows dropped in all" in e]
    assert len(in_all) == 1
    dropped = re.search(r"(\d+) steps", in_all[0])
    assert dropped is not None and int(dropped.group(1)) > 0
    # The file system answers again: what the worker held and what was left at close is
    # written; in order, none doubled, and each of the 35 steps written or counted dropped.
    _wait_for(lambda: nbmonitor.open(mon.run_dir).meta.get("status") == "degraded")
    written = nbmonitor.open(mon.run_dir).history()["step"].tolist()
    assert written == sorted(set(written)) and written[-1] == 35.0
    assert len(written) + int(dropped.group(1)) == 35
