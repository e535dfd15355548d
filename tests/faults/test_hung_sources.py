"""A hung source (backend, run-log write, view) blocks neither the loop, the reads, flush()
nor close(); the status names it and for how long; the rest of each tick goes on."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.helpers import WAIT_S, mlp, train

import nbmonitor
from nbmonitor._engine.frame import Frame
from nbmonitor.live.monitor import Monitor

# A hung source hangs this long unless the test releases it; what must not wait for it is
# asserted to take less than BOUNDED_S: far below the hang, far above what a loaded machine
# takes (docs/testing.md lists these as timing-based, and why).
HANG_S = 300.0
BOUNDED_S = HANG_S / 4


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the hung worker returns and its thread ends before the leak check


def _monitor(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Monitor, Any, Any]:
    monkeypatch.setattr("nbmonitor.live.monitor.CLOSE_WAIT_S", 0.5)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    train(model, opt, mon, 3)
    assert mon.flush(timeout=WAIT_S)
    return mon, model, opt


def _wait_for(predicate: Any, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert predicate()


def test_a_hung_backend_costs_only_the_system_stats(tmp_path, monkeypatch, release):
    mon, model, opt = _monitor(tmp_path, monkeypatch)
    sample = mon.backend.sample

    def hung() -> dict[str, float]:
        release.wait(HANG_S)
        return sample()

    monkeypatch.setattr(mon.backend, "sample", hung)
    _wait_for(lambda: mon.status.startswith("degraded: system sampling hung for"))
    start = time.monotonic()
    train(model, opt, mon, 3)
    assert time.monotonic() - start < BOUNDED_S  # the loop never waits on nbmonitor
    start = time.monotonic()
    assert mon.flush(timeout=WAIT_S)  # the rest of the tick goes on
    assert time.monotonic() - start < BOUNDED_S
    assert mon.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert math.isnan(mon.system()["cpu_percent"][-1])  # unavailable while hung, not stale
    mon.frame()  # does not raise: the tick is not stuck
    assert any(e.split(" ", 1)[1].startswith("sample: TimeoutError") for e in mon.errors)
    start = time.monotonic()
    mon.close()
    assert time.monotonic() - start < BOUNDED_S
    assert mon.status == "closed"
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert run.meta["status"] in ("closed", "degraded")


def test_a_hung_run_log_costs_only_the_disk_and_is_named(tmp_path, monkeypatch, release):
    mon, model, opt = _monitor(tmp_path, monkeypatch)
    runlog = mon.internals.runlog
    write = runlog.write

    def hung(batch: Any) -> None:
        release.wait(HANG_S)
        write(batch)

    monkeypatch.setattr(runlog, "write", hung)
    train(model, opt, mon, 2)
    _wait_for(lambda: mon.status.startswith("degraded: run log writing hung for"))
    train(model, opt, mon, 2)
    assert mon.flush(timeout=WAIT_S)
    assert mon.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    start = time.monotonic()
    mon.close()
    assert time.monotonic() - start < BOUNDED_S
    assert any("the run log is hung" in e for e in mon.errors)
    # The file system answers again: the rows the worker held and those left at close reach
    # the disk, and the run is closed, saying what failed.
    release.set()
    _wait_for(lambda: nbmonitor.open(mon.run_dir).meta.get("status") == "degraded")
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert any("the run log is hung" in e for e in run.meta["errors"])


class _HungView:
    wants_detail = False

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.calls = 0

    def publish(self, frame: Frame) -> None:
        self.calls += 1
        self.release.wait(HANG_S)

    def close(self, frame: Frame) -> None:
        self.release.wait(HANG_S)


def test_a_hung_view_costs_only_the_view(tmp_path, monkeypatch, release):
    mon, model, opt = _monitor(tmp_path, monkeypatch)
    view = _HungView(release)
    mon.add_view(view)
    _wait_for(lambda: mon.status.startswith("degraded: dashboard update hung for"))
    assert view.calls == 1  # not queued: one call hangs, later frames are skipped
    train(model, opt, mon, 2)
    assert mon.flush(timeout=WAIT_S)
    assert mon.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    start = time.monotonic()
    mon.close()
    assert time.monotonic() - start < BOUNDED_S
    run = nbmonitor.open(mon.run_dir)
    assert run.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert run.meta["status"] == "degraded"
    assert view.calls == 1
