"""The multi-rank diagnoses on real two-rank jobs (gloo on 127.0.0.1, one process per rank,
tests/dist/gloo_job.py): ranks fed the same batches are named, with what to change; a rank
that stops making progress while the other waits is named while it stalls, with its last step
and phase, whether it is alive (stuck in its data phase) or frozen (SIGSTOP: it writes
nothing, even before its first sample); every rank stuck at one place names the job; ranks
whose gradients are never all-reduced are out of sync; a healthy sharded job stays silent.
The display rank (0) finds them live, from the other rank's files; the finished job, opened
from disk, says the same. Thresholds go through the public ``attach(thresholds=...)``."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
from typing import Any

import numpy as np
import pytest
from tests.dist.dist_helpers import launch_ranks
from tests.helpers import wait_for

import nbmonitor
from nbmonitor.replay import Job

SCRIPT = pathlib.Path(__file__).with_name("gloo_job.py")
JOB_RULES = {"same_batches", "rank_stalled", "straggler", "rank_divergence"}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class Ranks:
    """The two rank processes of one job, and its folder."""

    def __init__(self, tmp: pathlib.Path, mode: str, steps: int, stall_s: float) -> None:
        self.job_dir, self.procs, self.logs = launch_ranks(
            tmp, SCRIPT, [mode, str(steps), str(stall_s)], "g"
        )
        # The folder the ranks make their runs in: they wait for its ``release`` file.
        self.runs = self.job_dir.parent

    def events(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.job_dir / f"rank{rank}" / "events.jsonl"
        lines = path.read_text().splitlines() if path.is_file() else []
        found = []
        for line in lines:
            try:
                found.append(json.loads(line))
            except ValueError:  # the line being written
                continue
        return [e for e in found if e.get("rule") in JOB_RULES]

    def finish(self, timeout: float = 180) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            assert proc.wait(timeout) == 0, log.read_text()[-3000:]

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait(30)


@pytest.fixture
def job(tmp_path: pathlib.Path) -> Any:
    made: list[Ranks] = []

    def start(mode: str, steps: int = 60, stall_s: float = 30.0) -> Ranks:
        made.append(Ranks(tmp_path, mode, steps, stall_s))
        return made[-1]

    yield start
    for ranks in made:
        ranks.kill()


def test_ranks_fed_the_same_batches_are_named(job: Any) -> None:
    ranks = job("same")
    ranks.finish()
    opened = nbmonitor.open(ranks.job_dir)
    assert isinstance(opened, Job)
    # What the ranks computed: the same loss on every step (no DistributedSampler).
    loss0, loss1 = opened.history(0)["loss"], opened.history(1)["loss"]
    assert loss0.size == 60 and np.array_equal(loss0, loss1)
    live = [(e["rule"], e["subject"]) for e in ranks.events()]
    assert live == [("same_batches", "rank0")]
    message = ranks.events()[0]["message"]
    assert message.startswith(f"Ranks 0 and 1 on {socket.gethostname()} are training on the same")
    assert "(they have had the same loss on each of the last" in message
    assert "training on the same batches" in message and "DistributedSampler" in message
    assert [(a.rule, a.subject) for a in opened.alerts()] == [("same_batches", "rank0")]


def test_a_healthy_sharded_job_stays_silent(job: Any) -> None:
    ranks = job("healthy")
    ranks.finish()
    opened = nbmonitor.open(ranks.job_dir)
    assert isinstance(opened, Job)
    loss0, loss1 = opened.history(0)["loss"], opened.history(1)["loss"]
    assert loss0.size == loss1.size == 60 and not np.isclose(loss0, loss1).any()
    assert ranks.events() == []
    assert [a for a in opened.alerts() if a.rule in JOB_RULES] == []


def test_a_rank_stuck_in_its_data_phase_is_named_while_it_stalls(job: Any) -> None:
    ranks = job("stall", steps=40, stall_s=3.0)
    try:
        assert wait_for(ranks.events, timeout=150), "no alert while rank 1 stalls"
        [event] = ranks.events()
        assert (event["rule"], event["subject"]) == ("rank_stalled", "rank1")
        message = event["message"]
        assert message.startswith(f"Rank 1 on {socket.gethostname()} is stalling the job")
        assert "in the data phase of step 21 (before its forward pass" in message
        assert "its last completed step is 20, and it is in the data phase" in message
        # Blocked in DDP's all-reduce: inside the backward pass or at its end, as the gradient
        # hooks ran before DDP's own wait.
        assert "while rank 0 waits " in message and "backward pass of step 21" in message
        assert f"py-spy dump --pid {ranks.procs[1].pid}" in message
        assert event["step"] == 20
    finally:
        (ranks.runs / "release").touch()
    ranks.finish()
    assert [e["subject"] for e in ranks.events()] == ["rank1"]  # once


def test_a_frozen_rank_is_named(job: Any) -> None:
    ranks = job("freeze", steps=40, stall_s=3.0)
    try:
        assert wait_for(ranks.events, timeout=150), "no alert while rank 1 is frozen"
        [event] = ranks.events()
        assert (event["rule"], event["subject"]) == ("rank_stalled", "rank1")
        assert "has written nothing for" in event["message"]
        assert "its process is frozen or dead" in event["message"]
    finally:
        os.kill(ranks.procs[1].pid, signal.SIGCONT)
    ranks.finish()


def test_a_rank_frozen_before_its_first_sample_is_named_with_how_long(job: Any) -> None:
    # Rank 1 stops itself at its 4th step, before its sampler wrote anything: its silence is
    # counted from what is known of it (its run's start), never NaN.
    ranks = job("freeze_early", steps=20, stall_s=3.0)
    try:
        assert wait_for(ranks.events, timeout=150), "no alert while rank 1 is frozen"
        [event] = ranks.events()
        assert (event["rule"], event["subject"]) == ("rank_stalled", "rank1")
        message = event["message"]
        assert message.startswith(f"Rank 1 on {socket.gethostname()} is stalling the job")
        silence = re.search(r"has written nothing for (\d+) s \(", message)
        assert silence is not None, message
        assert 3 <= int(silence.group(1)) < 150 and "nan" not in message
        assert "its process is frozen or dead" in message
        assert "while rank 0 waits " in message and "of step 4" in message
        assert f"py-spy dump --pid {ranks.procs[1].pid}" in message
    finally:
        os.kill(ranks.procs[1].pid, signal.SIGCONT)
    ranks.finish()


def test_every_rank_stuck_at_one_place_names_the_job(job: Any) -> None:
    ranks = job("all_stall", steps=30, stall_s=3.0)
    try:
        assert wait_for(ranks.events, timeout=150), "no alert while every rank waits"
        [event] = ranks.events()
        assert (event["rule"], event["subject"], event["step"]) == ("rank_stalled", "run", 20)
        message = event["message"]
        host = socket.gethostname()
        assert message.startswith("The job is stalled: every rank waits for its next batch")
        assert f"(ranks 0 and 1 on {host} have made no progress for " in message
        silence = re.search(
            r"no progress for (\d+) s, every one in the data phase of step 21", message
        )
        assert silence is not None, message
        assert 3 <= int(silence.group(1)) < 150
        pids = [p.pid for p in ranks.procs]
        assert f"--pid {pids[0]} (rank 0), --pid {pids[1]} (rank 1)" in message
    finally:
        (ranks.runs / "release").touch()
    ranks.finish()
    assert [e["subject"] for e in ranks.events()] == ["run"]  # once


def test_ranks_out_of_sync_are_named_live_and_from_the_job_folder(job: Any) -> None:
    # Every forward and backward under DDP's no_sync(): the gradients are never all-reduced.
    ranks = job("no_sync", steps=20)
    try:
        assert wait_for(ranks.events, timeout=150), "no alert while the ranks drift apart"
    finally:
        (ranks.runs / "release").touch()
    ranks.finish()
    live = ranks.events()
    assert [(e["rule"], e["subject"]) for e in live] == [("rank_divergence", "rank0")]
    message = live[0]["message"]
    host = socket.gethostname()
    assert message.startswith(f"Ranks 0 and 1 on {host} are out of sync: the gradients are not")
    assert "(they have grad norms that differ on " in message and "no_sync()" in message
    assert live[0]["evidence"]["ranks"] == [0, 1]
    opened = nbmonitor.open(ranks.job_dir)
    assert isinstance(opened, Job)
    grads0, grads1 = opened.history(0)["grad_norm"], opened.history(1)["grad_norm"]
    n = min(grads0.size, grads1.size)
    assert n >= 20 and not np.isclose(grads0[:n], grads1[:n]).any()
    assert [(a.rule, a.subject) for a in opened.alerts()] == [("rank_divergence", "rank0")]
