"""The disk comes back: while the run log cannot be written (disk full), rows wait in bounded
memory, the failure is reported, and writing resumes with nothing lost, torn or doubled."""

from __future__ import annotations

import contextlib
import errno
import tracemalloc
from typing import Any

import torch
from tests.helpers import mlp, train

import nbmonitor
import nbmonitor.sinks.runlog as runlog_module
from nbmonitor.sinks import Batch


class FullDisk:
    """Wraps a record file: while ``full``, a write takes ``partial`` bytes at most once, then
    raises ENOSPC (the OS took part of a line, then the disk filled)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.full = False
        self.partial = 0
        self.calls = 0

    def write(self, data: Any) -> int:
        self.calls += 1
        if self.full:
            if self.partial:
                n, self.partial = self.partial, 0
                return int(self.inner.write(bytes(data[:n])))
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.inner.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _attach(tmp_path):  # type: ignore[no-untyped-def]
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60)
    sink = mon.internals.runlog
    disk = FullDisk(sink._files["steps"])
    sink._files["steps"] = disk
    return model, opt, mon, sink, disk


def test_rows_wait_while_the_disk_is_full_and_are_written_when_it_frees(tmp_path):
    model, opt, mon, sink, disk = _attach(tmp_path)
    with mon:
        train(model, opt, mon, 5)
        assert mon.flush()
        disk.full, disk.partial = True, 7  # part of a line reaches the disk, then it is full
        for _ in range(4):
            train(model, opt, mon, 5)
            assert mon.flush()
        failures = [e for e in mon.errors if "sink:runlog" in e]
        assert len(failures) == 1 and "No space left" in failures[0]  # once per spell
        assert "wait in memory" in failures[0]
        assert mon.status == "degraded"
        assert sink.lost_rows == 0
        disk.full = False
        train(model, opt, mon, 5)
        assert mon.flush()
        assert len([e for e in mon.errors if "sink:runlog" in e]) == 1
    steps = nbmonitor.open(mon.run_dir).history()["step"].tolist()
    assert steps == [float(s) for s in range(1, 31)]  # in order, none torn, none doubled


def test_the_backlog_is_bounded_and_what_is_dropped_is_counted_and_said(tmp_path, monkeypatch):
    monkeypatch.setattr(runlog_module, "BACKLOG_BYTES", 4096)
    model, opt, mon, sink, disk = _attach(tmp_path)
    with mon:
        disk.full = True
        for _ in range(20):
            train(model, opt, mon, 5)
            assert mon.flush()
        assert sink._backlog_bytes <= 4096
        assert sink.lost_rows > 0
        errors = [e for e in mon.errors if "sink:runlog" in e]
        assert len(errors) == 2 and "dropped" in errors[1]
        disk.full = False
        train(model, opt, mon, 2)
        assert mon.flush()
        lost = sink.lost_rows
    steps = nbmonitor.open(mon.run_dir).history()["step"].tolist()
    # The oldest rows waited and were written; the rows past the bound are gone (counted, with
    # the system and layer rows dropped beside them); later rows are written again once the
    # disk is back (each flush took every step that had ended, step 100 too).
    kept = [s for s in steps if s <= 100]
    assert kept == [float(s) for s in range(1, len(kept) + 1)]
    assert 0 < len(kept) < 100 and lost >= 100 - len(kept)
    assert steps[len(kept) :] == [101.0, 102.0]


def test_a_disk_still_full_at_close_is_reported_not_raised(tmp_path):
    model, opt, mon, sink, disk = _attach(tmp_path)
    train(model, opt, mon, 3)
    disk.full = True
    mon.close()
    assert mon.status == "closed"
    assert any("could not be written" in str(e) for e in sink.close_errors)


def test_what_waits_for_a_full_disk_costs_its_bound_not_a_multiple(tmp_path, monkeypatch):
    # Rows wait as the writes' own bytes: retrying every tick, the memory held (tracemalloc's
    # peak, the rows themselves made once beforehand) stays within the bound plus one write,
    # never two or three copies of what waits (about 180 MB for the 64 MiB bound before).
    bound = 8 * 2**20
    monkeypatch.setattr(runlog_module, "BACKLOG_BYTES", bound)
    _model, _opt, mon, sink, disk = _attach(tmp_path)  # the model held: its monitor lives
    rows = [{"step": float(i), "loss": 0.5, **{f"metric_{k}": 1.0 + k for k in range(30)}}
            for i in range(300)]  # fmt: skip
    batch = Batch({"steps": rows})
    one_write = len(runlog_module.encode_lines(rows))
    with mon:
        disk.full = True
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(2 * bound // one_write):  # twice what may wait: some are dropped
                with contextlib.suppress(OSError):
                    sink.write(batch)
                with contextlib.suppress(OSError):
                    sink.flush()  # a tick: what waits is tried again
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert bound - one_write < sink._backlog_bytes <= bound
        assert sink.lost_rows > 0
        assert peak < bound + 4 * one_write + 2**20, (peak, bound)
        disk.full = False
