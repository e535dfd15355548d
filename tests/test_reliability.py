"""flush() shows everything recorded; the clock is injectable; unknown options are named.

Hung sources: tests/faults/test_hung_sources.py."""

from __future__ import annotations

import numpy as np
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor.live.monitor import Monitor


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
