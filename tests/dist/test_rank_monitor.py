"""attach() as one rank of a job (torchrun's environment, in this process): the run goes to
rank<r>/ of the job folder, other ranks than display_rank show nothing, the data wait is
measured; a single-process run keeps its layout."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor.replay.job import Job
from nbmonitor.ui.console import ConsoleView

ID_VARS = ("NBMONITOR_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, job: str = "job1") -> None:
    for key in ID_VARS:
        monkeypatch.delenv(key, raising=False)
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "NBMONITOR_JOB_ID": job}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))


def test_a_rank_other_than_the_display_rank_records_silently(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    as_rank(monkeypatch, 1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level(logging.INFO, logger="nbmonitor"):
        mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05)
        try:
            assert mon.views == () and not mon.displays
            train(model, opt, mon, steps=5)
            mon.flush()
            history = mon.history()
        finally:
            mon.close()
    assert caplog.records == []  # no status line, no summary: rank 0 shows the job
    assert mon.run_dir == tmp_path / "job1-Sequential" / "rank1"
    assert mon.job_dir == tmp_path / "job1-Sequential" and mon.name == "job1-Sequential/rank1"
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert (meta["rank"], meta["local_rank"], meta["world_size"], meta["device"]) == (
        1,
        1,
        2,
        "cpu",
    )
    assert "phase_data_s" in history and len(history["phase_data_s"]) == 5
    assert not (mon.job_dir / "ranks_summary.json").exists()  # written by the display rank


def test_the_display_rank_shows_and_writes_the_summary(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    as_rank(monkeypatch, 1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with caplog.at_level(logging.INFO, logger="nbmonitor"):
        mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05, display_rank=1)
        try:
            assert mon.displays and isinstance(mon.views[0], ConsoleView)
            train(model, opt, mon, steps=3)
        finally:
            mon.close()
    assert mon.job_dir is not None
    assert (mon.job_dir / "ranks_summary.json").is_file()
    assert any("cross-rank summary" in r.getMessage() for r in caplog.records)
    job = nbmonitor.open(mon.job_dir)
    assert isinstance(job, Job) and sorted(job.ranks) == [1]
    assert job.status == "running"  # rank 0 of the two never wrote


def test_a_single_process_run_keeps_its_layout(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("RANK", "WORLD_SIZE", *ID_VARS):
        monkeypatch.delenv(key, raising=False)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05, display=False)
    try:
        train(model, opt, mon, steps=3)
        mon.flush()
        history = mon.history()
    finally:
        mon.close()
    assert mon.run_dir.parent == tmp_path and mon.run_dir.name.endswith("-Sequential")
    assert mon.job_dir is None and mon.rank is None
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert "rank" not in meta and "layout" not in meta
    assert not isinstance(nbmonitor.open(mon.run_dir), Job)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_display_rank_must_be_a_rank(bad: object) -> None:
    model = mlp()
    with pytest.raises(ValueError, match="display_rank must be an int >= 0"):
        nbmonitor.attach(model, display_rank=bad)  # type: ignore[arg-type]


def test_display_rank_must_be_in_the_job(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_rank(monkeypatch, 0)
    with pytest.raises(ValueError, match="display_rank=2 is not a rank of this job"):
        nbmonitor.attach(mlp(), run_dir=tmp_path, display_rank=2)
    assert not any(tmp_path.iterdir())  # checked before anything is written
