"""The same-batches and stalled-rank rules on columns made by hand (no torch): what each names,
and the healthy cases they must leave alone. The real jobs are in test_job_diagnoses.py."""

from __future__ import annotations

import pathlib

import numpy as np

import nbmonitor

from nbmonitor._engine.derive.job_report import job_thresholds
from nbmonitor._engine.derive.ranks import RankState
from nbmonitor.health import Health, HealthInput
from nbmonitor.health.rules.replicas import SAME_STEPS, SameBatches, same_batches
from nbmonitor.health.rules.stalls import RankStalled, stalled, stuck_together
from nbmonitor.health.view import RankColumns, RankProgress
from nbmonitor.replay.follow import JobFeed
from nbmonitor.replay.job import Job
from nbmonitor.sinks import RunLogSink

DATA, FORWARD, BACKWARD, OTHER = 0.0, 1.0, 2.0, 3.0


def columns(loss: np.ndarray, step_time: float = 0.05, **progress: object) -> RankColumns:
    r, n = loss.shape
    steps = np.arange(1.0, n + 1)
    made = None
    if progress:
        fields = {
            "seen": np.full(r, 200.0),
            "step": np.full(r, float(n)),
            "phase": np.full(r, BACKWARD),
            "step_end": np.full(r, 100.0),
            "status": ("running",) * r,
            "pids": tuple(100 + i for i in range(r)),
        }
        fields.update(progress)
        made = RankProgress(**fields)  # type: ignore[arg-type]
    hosts = tuple(f"node{i}" for i in range(r))
    return RankColumns(tuple(range(r)), hosts, steps, np.full((r, n), step_time), None, loss, made)


def losses(ranks: int, n: int = 40, seed: int = 0) -> np.ndarray:
    """Each rank's own batches: a falling loss, with the noise of its batch."""
    rng = np.random.default_rng(seed)
    return 2.0 / np.sqrt(np.arange(1.0, n + 1)) + rng.normal(0, 0.02, (ranks, n))


def test_ranks_with_equal_losses_are_grouped_and_named() -> None:
    loss = losses(3)
    loss[2] = loss[0]
    assert same_batches(columns(loss)) == [(0, 2)]
    alerts = Health(rules=(SameBatches,)).check(
        HealthInput(step=40, time=0.0, steps={}, ranks=columns(loss))
    )
    assert [(a.rule, a.subject, a.step) for a in alerts] == [("same_batches", "rank0", 40)]
    assert alerts[0].message.startswith("Ranks 0 and 2 on node0 and node2 are training on the")
    assert "(they have had the same loss on each of the last" in alerts[0].message
    assert "these ranks do the work of one rank" in alerts[0].message
    assert "DistributedSampler" in alerts[0].message
    every = np.tile(loss[0], (4, 1))
    assert same_batches(columns(every)) == [(0, 1, 2, 3)]


def test_equal_up_to_device_rounding_counts_as_equal() -> None:
    loss = np.tile(losses(1)[0], (2, 1))
    loss[1] *= 1 + 1e-7  # a non-deterministic kernel on one rank
    assert same_batches(columns(loss)) == [(0, 1)]


def test_healthy_shards_and_uninformative_losses_are_left_alone() -> None:
    assert same_batches(columns(losses(4))) == []
    # Shards of a large batch: their means still differ by ~1e-3 of their value.
    close = np.tile(losses(1)[0], (2, 1))
    close[1] *= 1 + 1e-3 * np.random.default_rng(1).choice([-1, 1], close.shape[1])
    assert same_batches(columns(close)) == []
    # A loss stuck at one value (a collapsed model) agrees on any data.
    assert same_batches(columns(np.full((2, 40), np.log(64.0)))) == []
    # Too few steps, or one rank.
    short = np.tile(losses(1, n=SAME_STEPS - 1)[0], (2, 1))
    assert same_batches(columns(short)) == []
    assert same_batches(columns(losses(1))) == []
    # Steps where a rank has no loss are not compared.
    gaps = np.tile(losses(1)[0], (2, 1))
    gaps[1, :] = np.nan
    assert same_batches(columns(gaps)) == []


def test_a_rank_behind_the_others_is_named_with_its_step_and_phase() -> None:
    ranks = columns(losses(3), phase=np.array([BACKWARD, BACKWARD, DATA]))
    found = stalled(ranks, stall_s=30.0)
    assert list(found) == [2] and found[2].severity == "warning"
    assert "has made no progress for 100 s: its last completed step is 40" in found[2].said
    assert "in the data phase of step 41" in found[2].said
    assert "the other ranks wait in the backward pass of step 41" in found[2].said
    alerts = Health(rules=(RankStalled,)).check(
        HealthInput(step=40, time=200.0, steps={}, ranks=ranks)
    )
    assert [(a.rule, a.subject, a.severity) for a in alerts] == [("rank_stalled", "rank2", "warning")]
    assert alerts[0].message.startswith("Rank 2 on node2 is stalling the job")
    assert "py-spy dump --pid 102" in alerts[0].message


def test_a_rank_that_writes_nothing_or_left_the_job_is_named() -> None:
    silent = columns(losses(2), seen=np.array([200.0, 150.0]), phase=np.array([OTHER, FORWARD]))
    found = stalled(silent, stall_s=30.0)
    assert list(found) == [1] and found[1].severity == "error"
    assert "has written nothing for 50 s" in found[1].said
    assert "its last sample: in the forward pass of step 41" in found[1].said
    left = columns(losses(2), status=("running", "closed"), phase=np.array([BACKWARD, DATA]))
    found = stalled(left, stall_s=30.0)
    assert list(found) == [1] and found[1].severity == "error"
    assert "it ended its run (closed) after step 40" in found[1].said


def test_a_rank_frozen_before_it_wrote_anything_is_named_with_a_finite_silence() -> None:
    # No sample and no step of rank 1: silent since its run started (at 150), else since the
    # job's start, else at least as long as the job has made no step; never NaN.
    nothing = {"seen": np.array([200.0, np.nan]), "step": np.array([3.0, np.nan])}
    nothing["step_end"] = np.array([100.0, np.nan])
    found = stalled(columns(losses(2), started=np.array([140.0, 150.0]), **nothing), 30.0)
    assert list(found) == [1] and found[1].severity == "error"
    assert "has written nothing for 50 s (since its run started: no step, no sample)" in (
        found[1].said
    )
    found = stalled(columns(losses(2), started=np.array([140.0, np.nan]), **nothing), 30.0)
    assert "has written nothing for 60 s (since the job started: no step, no sample)" in (
        found[1].said
    )
    found = stalled(columns(losses(2), **nothing), 30.0)
    assert "has written nothing for at least 100 s (no step, no sample)" in found[1].said
    # Its steps written, no system sample yet: silent since its last step ended.
    steps_only = {"seen": np.array([200.0, np.nan]), "step_end": np.array([100.0, 90.0])}
    found = stalled(columns(losses(2), step=np.array([4.0, 3.0]), **steps_only), 30.0)
    assert "has written nothing for 110 s (its last record: the end of step 3)" in found[1].said


def test_every_rank_stuck_at_one_place_names_the_job() -> None:
    here = columns(losses(2), phase=np.array([DATA, DATA]))
    assert stalled(here, 30.0) == {}  # no rank to blame
    assert stuck_together(here, 30.0) == (0, 40.0, 100.0)
    alerts = Health(rules=(RankStalled,)).check(
        HealthInput(step=40, time=200.0, steps={}, ranks=here)
    )
    assert [(a.rule, a.subject, a.severity, a.step) for a in alerts] == [
        ("rank_stalled", "run", "warning", 40)
    ]
    message = alerts[0].message
    assert message.startswith("The job is stalled: every rank waits for its next batch")
    assert (
        "(ranks 0 and 1 on node0 and node1 have made no progress for 100 s, every one in "
        "the data phase of step 41)"
    ) in message
    assert "--pid 100 (rank 0), --pid 101 (rank 1)" in message
    assert alerts[0].evidence == {
        "ranks": [0, 1], "hosts": ["node0", "node1"], "pids": [100, 101], "idle_s": 100.0,
        "steps_done": 40.0, "phase": "data",
    }  # fmt: skip
    assert alerts[0].cause.startswith("The job is stalled") and "py-spy" in alerts[0].fix
    # In DDP's all-reduce: a collective that does not complete.
    there = columns(losses(3), phase=np.full(3, BACKWARD))
    assert stuck_together(there, 30.0) == (2, 40.0, 100.0)
    alerts = Health(rules=(RankStalled,)).check(
        HealthInput(step=40, time=200.0, steps={}, ranks=there)
    )
    assert "ranks 0, 1 and 2" in alerts[0].message
    assert "in the backward pass of step 41" in alerts[0].message
    assert "a collective that does not complete" in alerts[0].message
    # Not while steps still complete, nor when a rank is elsewhere, silent or gone.
    recent = columns(losses(2), step_end=np.full(2, 190.0), phase=np.array([DATA, DATA]))
    assert stuck_together(recent, 30.0) is None
    assert stuck_together(columns(losses(2), phase=np.array([BACKWARD, DATA])), 30.0) is None
    gone = columns(losses(2), status=("running", "closed"), phase=np.array([DATA, DATA]))
    assert stuck_together(gone, 30.0) is None
    silent = columns(losses(2), seen=np.array([200.0, 150.0]), phase=np.array([DATA, DATA]))
    assert stuck_together(silent, 30.0) is None


def test_no_rank_is_named_when_nothing_holds_the_job_up() -> None:
    phases = np.array([BACKWARD, DATA])
    # Steps completed recently.
    assert stalled(columns(losses(2), step_end=np.full(2, 190.0), phase=phases), 30.0) == {}
    # Slow steps: 5 median step times (125 s) have not passed without one.
    assert stalled(columns(losses(2), step_time=25.0, phase=phases), 30.0) == {}
    # Every rank at the same place (a long evaluation on all ranks, all slow): no rank, the
    # job as a whole (test_every_rank_stuck_at_one_place_names_the_job).
    assert stalled(columns(losses(2), phase=np.array([DATA, DATA])), 30.0) == {}
    # A finished job: every rank closed; or one closed while the other works after its steps.
    done = ("closed", "closed")
    assert stalled(columns(losses(2), status=done, phase=phases), 30.0) == {}
    after = columns(losses(2), status=("running", "closed"), phase=np.array([DATA, DATA]))
    assert stalled(after, 30.0) == {}
    # No step yet, no progress known, or one rank.
    assert stalled(columns(losses(2), step_end=np.full(2, np.nan), phase=phases), 30.0) == {}
    assert stalled(columns(losses(2)), 30.0) == {}  # every rank in backward
    assert stalled(columns(losses(1), phase=np.array([DATA])), 30.0) == {}


def test_a_job_is_judged_with_the_thresholds_its_ranks_ran_with() -> None:
    state = RankState()
    state.set_meta(0, {"thresholds": {"stall_s": 5.0}})
    state.set_meta(1, {"thresholds": {"stall_s": 7.0}})
    assert job_thresholds(state).stall_s == 5.0
    state.set_meta(0, {"thresholds": {"no_such": 1}})  # another version's: the next rank's
    assert job_thresholds(state).stall_s == 7.0
    state.set_meta(1, {"thresholds": {"stall_s": -1}})
    assert job_thresholds(state).stall_s == 30.0  # none valid: the defaults


def test_a_stalled_job_on_disk_names_the_rank_live_and_opened(tmp_path: pathlib.Path) -> None:
    # Both ranks did 30 steps; then for 70 s rank 0 sampled itself in backward, rank 1 in its
    # data phase: opened from disk, and followed as nbmonitor.tail() does, rank 1 is named.
    root = tmp_path / "runs"
    logs = []
    for rank in (0, 1):
        meta = {"rank": rank, "world_size": 2, "hostname": f"node{rank}", "pid": 4000 + rank}
        log = RunLogSink.create(root, "Net", meta, job_id="j9", rank=rank, world_size=2)
        steps = [
            {"step": float(s), "time": 100.0 + s, "step_time": 1.0, "loss": 1.0 / s + rank}
            for s in range(1, 31)
        ]
        log.write_steps(steps)
        samples = [
            {"step": 30.0, "time": t, "phase": BACKWARD if rank == 0 else DATA}
            for t in np.arange(131.0, 200.0, 0.5)
        ]
        log.write_samples(samples)
        log.flush()
        logs.append(log)  # still running: closed at the end
    try:
        judge(root / "j9-Net")
    finally:
        for log in logs:
            log.close({"status": "closed"})


def judge(job_dir: pathlib.Path) -> None:
    opened = nbmonitor.open(job_dir)
    assert isinstance(opened, Job)
    stalls = [a for a in opened.alerts() if a.rule == "rank_stalled"]
    assert [a.subject for a in stalls] == ["rank1"]
    assert "in the data phase of step 31" in stalls[0].message and "--pid 4001" in stalls[0].message
    feed = JobFeed(job_dir)
    feed.read()
    assert [a.subject for a in feed.alerts if a.rule == "rank_stalled"] == ["rank1"]
    feed.read()  # once per episode
    assert [a.subject for a in feed.alerts if a.rule == "rank_stalled"] == ["rank1"]
