"""A job's steering requests (runs/job_control.py), without torch: the step a request names
(ahead by the steps made in a few sampler intervals plus a slack, from the job's files), every
rank reading every request once (none removed), a resume never before the pause it follows, a
checkpoint path made per rank, a request read after its step said, and a request file that is
not the owner's, or is writable by others, refused."""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest

from nbmonitor.runs.control import ControlRequest, Refused, make_control_dir
from nbmonitor.runs.job_control import (
    MAX_CARRY_S,
    MIN_AHEAD,
    SLACK_S,
    JobReader,
    Position,
    at_step_for,
    job_position,
    rate_of,
    steps_ahead,
    write_job_request,
)
from nbmonitor.sinks import RunLogSink


def test_the_step_named_is_ahead_by_the_steps_of_a_few_ticks_and_a_slack() -> None:
    assert steps_ahead(50.0, 0.1) == math.ceil(50 * (3 * 0.1 + SLACK_S)) + MIN_AHEAD
    assert steps_ahead(0.01, 0.5) == MIN_AHEAD + 1  # a slow job: a few steps
    assert steps_ahead(math.nan, 0.5) == steps_ahead(0.0, 0.5) == 20  # no rate yet
    # Carried forward at the rate from the last step's time, at most MAX_CARRY_S.
    pos = Position(100, 1000.0, 10.0)
    assert pos.now(1001.5) == 115.0
    assert pos.now(1000.0 + 10 * MAX_CARRY_S) == 100 + 10 * MAX_CARRY_S
    assert at_step_for(pos, 0.1, now=1001.5) == 115 + steps_ahead(10.0, 0.1)
    assert rate_of([1, 2, 3, 5], [10.0, 10.5, 11.0, 12.0]) == 2.0
    assert math.isnan(rate_of([7.0], [1.0]))


def test_where_a_job_is_comes_from_its_ranks_files(tmp_path: pathlib.Path) -> None:
    job = None
    for rank, last in ((0, 40), (1, 39)):  # rank 1 a step behind
        meta = {"rank": rank, "world_size": 2, "attach": {"interval": 0.2 + 0.1 * rank}}
        log = RunLogSink.create(tmp_path, "Net", meta, job_id="j1", rank=rank, world_size=2)
        log.write_steps([{"step": float(s), "time": 100.0 + s / 4} for s in range(1, last + 1)])
        log.close({"status": "closed"})
        job = log.path.parent
    assert job is not None
    position, interval = job_position(job)
    assert (position.step, position.time, position.rate) == (40, 110.0, 4.0)
    assert interval == pytest.approx(0.3)  # the slowest sampler's


def read(reader: JobReader) -> list[tuple[str, object, object, str]]:
    out = []
    for got in reader.poll():
        assert isinstance(got, ControlRequest), got
        out.append((got.kind, got.value, got.at_step, got.source))
    return out


def test_every_rank_reads_every_request_once_and_none_is_removed(tmp_path: pathlib.Path) -> None:
    make_control_dir(tmp_path)
    steps = {0: 10, 1: 10}
    late: list[tuple[int, str, int, int]] = []
    readers = {
        r: JobReader(
            tmp_path, r, lambda r=r: steps[r], late=lambda f, n, a, r=r: late.append((r, f, n, a))
        )
        for r in (0, 1)
    }
    write_job_request(tmp_path, "pause", at_step=30, source="ctl")
    write_job_request(tmp_path, "checkpoint", "/ckpt/model.pt", at_step=31, source="rank1:python")
    write_job_request(tmp_path, "resume", at_step=12, source="ctl")  # before the pause: moved
    for rank in (0, 1):
        assert read(readers[rank]) == [
            ("pause", None, 30, "job/ctl"),
            ("checkpoint", f"/ckpt/model-rank{rank}.pt", 31, "job/rank1:python"),
            ("resume", None, 30, "job/ctl"),
        ]
        assert readers[rank].poll() == []  # each once
    assert len(os.listdir(tmp_path / "control")) == 3  # for ranks still to read them

    # Rank 1 reads a stop after the step it names: it says so (and acts at its next step).
    steps[1] = 60
    path = write_job_request(tmp_path, "stop", at_step=50)
    assert read(readers[0]) == [("stop", None, 50, "job/ctl")]
    assert read(readers[1]) == [("stop", None, 50, "job/ctl")]
    assert late == [(1, path.name, 50, 60)]


def test_a_request_file_not_the_owners_own_is_refused_once(tmp_path: pathlib.Path) -> None:
    make_control_dir(tmp_path)
    reader = JobReader(tmp_path, 0, lambda: 0)
    path = write_job_request(tmp_path, "stop", at_step=5)
    os.chmod(path, 0o666)
    [got] = reader.poll()
    assert isinstance(got, Refused) and "writable by group or others" in got.why
    assert path.exists() and reader.poll() == []
    other = JobReader(tmp_path, 0, lambda: 0, uid=os.getuid() + 1)
    bad = tmp_path / "control" / "1-1.json"
    bad.write_text(json.dumps({"kind": "stop", "at_step": 3}))
    os.chmod(bad, 0o600)
    assert all(isinstance(g, Refused) for g in other.poll())
