"""The run directory deleted mid-run is reported at once (the next tick) and made again: rows
from then on reach the disk instead of unlinked files."""

from __future__ import annotations

import shutil

import torch
from tests.helpers import mlp, train

import nbmonitor


def test_a_deleted_run_directory_is_reported_at_once_and_made_again(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        train(model, opt, mon, 3)
        assert mon.flush()
        shutil.rmtree(mon.run_dir)
        train(model, opt, mon, 2)
        assert mon.flush()  # the next tick sees it
        deleted = [e for e in mon.errors if "was deleted while the run was writing" in e]
        assert len(deleted) == 1 and "made again" in deleted[0]
        assert mon.status == "degraded"
        train(model, opt, mon, 3)
        assert mon.flush()
        assert len([e for e in mon.errors if "was deleted" in e]) == 1  # said once
    run = nbmonitor.open(mon.run_dir)
    assert run.meta["recreated"] is True and run.meta["status"] == "degraded"
    steps = run.history()["step"].tolist()
    assert steps[-3:] == [6.0, 7.0, 8.0]  # written after it was made again
    assert set(steps) <= {4.0, 5.0, 6.0, 7.0, 8.0}  # the rows before went with it


def test_a_run_directory_that_cannot_be_made_again_keeps_rows_in_memory(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    root = tmp_path / "runs"
    with nbmonitor.attach(model, opt, run_dir=root, display=False, interval=60) as mon:
        train(model, opt, mon, 2)
        assert mon.flush()
        shutil.rmtree(root)
        root.write_text("a file where the runs folder was")  # mkdir now fails
        train(model, opt, mon, 2)
        assert mon.flush()
        train(model, opt, mon, 2)
        assert mon.flush()
        lost = [e for e in mon.errors if "cannot be made again" in e]
        assert len(lost) == 1
        assert mon.history()["step"].tolist()[-2:] == [5.0, 6.0]  # the live view goes on
        root.unlink()  # the folder can be made again
        train(model, opt, mon, 1)
        assert mon.flush()
        assert any("made again" in e and "cannot" not in e for e in mon.errors)
    steps = nbmonitor.open(mon.run_dir).history()["step"].tolist()
    assert steps[-1] == 7.0 and 5.0 in steps  # what waited in memory was written
