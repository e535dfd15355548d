"""A monitor goes away with its model: dropping the model (re-running a cell that builds a new
one) stops the sampler, frees the model and closes the run; re-running the same notebook cell
replaces the monitor it attached before."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import torch
from tests.helpers import WAIT_S, mlp, train, wait_for

import nbmonitor
import nbmonitor.live.registry as registry


def _samplers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "nbmonitor-sampler"}


def _wait_gone(threads: set[threading.Thread], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not any(t.is_alive() for t in threads)


def _attach_and_train(tmp_path, **kw):  # type: ignore[no-untyped-def]
    before = _samplers()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05, **kw)
    train(model, opt, mon, 3)
    return model, opt, mon, _samplers() - before


def test_dropping_model_and_monitor_stops_the_thread_and_frees_the_model(tmp_path):
    model, opt, mon, threads = _attach_and_train(tmp_path)
    assert len(threads) == 1
    model_ref = weakref.ref(model)
    run_dir = mon.run_dir
    del model, opt, mon
    gc.collect()
    assert model_ref() is None
    assert _wait_gone(threads)
    wait_for(lambda: json.loads((run_dir / "meta.json").read_text()).get("status") == "closed")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "closed" and meta["steps"] == 3
    assert nbmonitor.open(run_dir).history()["step"].tolist() == [1.0, 2.0, 3.0]


def test_a_monitor_still_held_releases_itself_when_its_model_goes(tmp_path):
    model, opt, mon, threads = _attach_and_train(tmp_path)
    model_ref = weakref.ref(model)
    del model, opt
    gc.collect()
    assert model_ref() is None
    assert _wait_gone(threads)
    wait_for(lambda: mon.status == "closed")
    assert mon.status == "closed" and mon.step == 3
    mon.log(loss=1.0)  # a no-op, not an error
    mon.close()
    assert json.loads((mon.run_dir / "meta.json").read_text())["status"] == "closed"


def test_an_unassigned_monitor_lives_as_long_as_its_model(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    gc.collect()
    [mon] = [m for m in registry.ALL if m.run_dir.parent == tmp_path]
    try:
        assert mon.status == "running"
        train(model, opt, mon, 2)
        assert mon.flush()
        assert mon.history()["step"].tolist()[:1] == [1.0]
    finally:
        mon.close()


def test_rerunning_the_same_cell_closes_the_monitor_it_attached_before(tmp_path, monkeypatch):
    cell = ["cell-a", 1]
    monkeypatch.setattr(registry, "current_cell", lambda: (cell[0], cell[1]))
    monkeypatch.setattr(registry, "BY_CELL", {})
    models = [mlp() for _ in range(4)]  # all alive: only the cell replaces monitors here
    first_model, _, first, threads = _attach_and_train(tmp_path)
    other_in_same_run = nbmonitor.attach(models[0], run_dir=tmp_path, display=False)
    assert first.status == "running"  # two models in one cell: both kept
    cell[1] = 2  # the cell runs again, with a new model
    second = nbmonitor.attach(models[1], run_dir=tmp_path, display=False)
    try:
        assert first.status == "closed" and other_in_same_run.status == "closed"
        assert _wait_gone(threads)
        assert second.status == "running"
        cell[0] = "cell-b"  # another cell leaves it alone
        third = nbmonitor.attach(models[2], run_dir=tmp_path, display=False)
        assert second.status == "running"
        third.close()
    finally:
        second.close()
    del first_model


def test_in_a_script_there_is_no_cell_to_replace(tmp_path):
    assert registry.current_cell() is None  # no IPython here
    models = [mlp(), mlp()]
    a = nbmonitor.attach(models[0], run_dir=tmp_path, display=False)
    b = nbmonitor.attach(models[1], run_dir=tmp_path, display=False)
    try:
        assert a.status == "running" and b.status == "running"
    finally:
        a.close()
        b.close()


def test_a_dropped_model_is_freed_at_once_without_a_garbage_collection(tmp_path):
    # No reference cycle through the monitor: the model (and its GPU memory) goes when the
    # user's last reference does, not at the next full collection.
    for options in ({}, {"check_forward": True}, {"activations": True}):
        gc.collect()
        gc.disable()
        try:
            model, opt, mon, threads = _attach_and_train(tmp_path, **options)
            model_ref = weakref.ref(model)
            del model, opt, mon
            assert model_ref() is None, options
        finally:
            gc.enable()
        assert _wait_gone(threads)
