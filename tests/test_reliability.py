"""A hung source never blocks the read API, flush() beyond its timeout, or close()."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor.monitor import Monitor


def test_a_hung_source_blocks_neither_reads_nor_flush_nor_close(tmp_path, monkeypatch):
    monkeypatch.setattr("nbmonitor.monitor.CLOSE_WAIT_S", 0.5)
    monkeypatch.setattr("nbmonitor.monitor.FLUSH_TIMEOUT_S", 0.5)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    release = threading.Event()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    try:
        train(model, opt, mon, 3)
        assert mon.flush(timeout=5.0)
        sample = mon.backend.sample

        def hung() -> dict[str, float]:
            release.wait(30)
            return sample()

        monkeypatch.setattr(mon.backend, "sample", hung)
        time.sleep(0.2)  # the sampler is now stuck in sample()
        train(model, opt, mon, 2)
        start = time.monotonic()
        h = mon.history()
        mon.layers()
        mon.events()
        mon.system()
        assert time.monotonic() - start < 0.2
        assert list(h["step"][:3]) == [1.0, 2.0, 3.0]
        start = time.monotonic()
        assert mon.flush(timeout=0.3) is False
        assert time.monotonic() - start < 1.0
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="stuck in a source"):
            mon.frame()
        assert time.monotonic() - start < 2.0
        start = time.monotonic()
        mon.close()
        assert time.monotonic() - start < 3.0
        assert mon.status == "closed"
        assert any("close: TimeoutError" in e for e in mon.errors)
    finally:
        release.set()
        mon.close()
    # the final rows written before the hang are on disk (step 3 was still open: a value
    # logged after its optimizer step could still have joined it)
    assert nbmonitor.open(mon.run_dir).history()["step"].tolist() == [1.0, 2.0]


def test_flush_shows_every_step_recorded_so_far(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        train(model, opt, mon, 4)
        assert len(mon.history()) == 0 or len(mon.history()["step"]) < 4  # no tick yet
        assert mon.flush()
        assert mon.history()["step"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_the_clock_is_injectable(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    now = [1_000_000.0]
    mon = Monitor(model, opt, run_dir=tmp_path, display=False, clock=lambda: now[0])
    mon.start()
    try:
        train(model, opt, mon, 2)
        now[0] += 5.0
        train(model, opt, mon, 1)
        mon.flush()
        h = mon.history()
    finally:
        mon.close()
    assert np.array_equal(h["time"], [1_000_000.0, 1_000_000.0, 1_000_005.0])
    assert mon.system()["time"][-1] == 1_000_005.0
    meta = nbmonitor.open(mon.run_dir).meta
    assert meta["start_timestamp"] == 1_000_000.0


def test_unknown_option_is_named_with_a_suggestion(tmp_path):
    model = mlp()
    try:
        nbmonitor.attach(model, None, run_dir=tmp_path, display=False, intervall=1.0)  # type: ignore[call-arg]
    except TypeError as exc:
        assert str(exc) == "nbmonitor.attach: unknown option 'intervall'; did you mean 'interval'?"
    else:
        raise AssertionError("an unknown option must raise")
