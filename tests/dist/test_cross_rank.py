"""The cross-rank figures (nbmonitor/_engine/derive/ranks.py), the straggler rule, and a job
written rank by rank and read back (open, summary, list_runs), all without torch."""

from __future__ import annotations

import json
import math
import pathlib
import time

import numpy as np
from tests.dist.dist_helpers import JOB_STEPS, write_job

import nbmonitor
from nbmonitor._engine.derive.ranks import (
    RankState,
    align,
    per_step,
    rank_columns,
    summary,
)
from nbmonitor._engine.derive.ranks_frame import ranks_frame
from nbmonitor.health import Alert, Health, HealthInput
from nbmonitor.health.rules.stragglers import MIN_STEPS, WINDOW, Stragglers, stragglers
from nbmonitor.health.rules.sync import RankDivergence
from nbmonitor.health.rules.time import PERSIST_STEPS
from nbmonitor.health.view import RankColumns
from nbmonitor.live.ranks import finish
from nbmonitor.replay.job import Job
from nbmonitor.runs import list_runs
from nbmonitor.runs.job import JobTail
from nbmonitor.runs.layout import claim_rank_dir, is_job, rank_dirs
from nbmonitor.sinks import RunLogSink


def test_oumi_style_summary_names_the_ranks_at_the_extremes() -> None:
    out = summary({0: 1.0, 1: 4.0, 2: 2.0, 3: math.nan})
    assert out["count"] == 3 and out["min_rank"] == 0 and out["max_rank"] == 1
    assert out["mean"] == 7 / 3 and out["median"] == 2.0 and out["min"] == 1 and out["max"] == 4
    assert math.isclose(out["std"], float(np.std([1.0, 4.0, 2.0], ddof=1)))
    assert summary({5: 3.0})["std"] == 0.0
    assert summary({}) == {"count": 0}


def state_of(step_times: dict[int, list[float]], **extra: dict[int, list[float]]) -> RankState:
    state = RankState()
    for rank, times in step_times.items():
        cols = {"step": np.arange(1.0, len(times) + 1), "step_time": np.array(times)}
        cols.update({k: np.array(v[rank]) for k, v in extra.items()})
        state.add_columns(rank, "steps", cols)
        state.set_meta(rank, {"hostname": f"node{rank}", "device_index": 0})
        state.add_columns(
            rank,
            "system",
            {"step": np.arange(3.0), "gpu0_util_percent": np.array([50.0, 60.0, 70.0 + rank]),
             "gpu1_util_percent": np.zeros(3)},
        )  # fmt: skip
    return state


def test_per_step_min_median_max_and_the_slowest_rank() -> None:
    state = state_of({0: [1.0, 1.0, 5.0], 1: [2.0, 1.5], 2: [3.0, 0.5, 1.0]})
    steps, matrix = align(state, "step_time")
    assert steps.tolist() == [1.0, 2.0, 3.0]
    assert np.isnan(matrix[1, 2])  # rank 1 has no step 3 (yet)
    table = per_step(steps, matrix, [0, 1, 2])
    assert table["min"].tolist() == [1.0, 0.5, 1.0]
    assert table["median"].tolist() == [2.0, 1.0, 3.0]
    assert table["max"].tolist() == [3.0, 1.5, 5.0]
    assert table["slowest_rank"].tolist() == [2.0, 1.0, 0.0]


def test_rank_metrics_take_each_ranks_own_device() -> None:
    frame = ranks_frame(state_of({0: [1.0], 1: [1.0]}), "job", "closed", 2)
    util = [row["gpu_util_percent"] for row in frame.table]
    assert util == [60.0, np.mean([50.0, 60.0, 71.0])]  # gpu0 (their device), not gpu1
    assert frame.summary["gpu_util_percent"]["max_rank"] == 1
    assert [row["host"] for row in frame.table] == ["node0", "node1"]
    # The gauges: each rank's own GPU, newest sample.
    assert [d["name"] for d in frame.devices] == ["rank0 (node0)", "rank1 (node1)"]
    assert [d["util_percent"] for d in frame.devices] == [70.0, 71.0]


def divergence(state: RankState) -> list[Alert]:
    columns = rank_columns(state)
    assert columns is not None
    return Health(rules=(RankDivergence,)).check(HealthInput(step=0, time=0.0, steps={}, ranks=columns))


def test_divergence_flags_the_rank_whose_grad_norm_differs() -> None:
    n = 20
    agree = {0: [1.0] * n, 1: [1.0] * n, 2: [1.0] * n}
    grads = {0: [2.0] * n, 1: [2.0] * n, 2: [2.5] * n}
    losses = {0: [1.0] * n, 1: [1.1] * n, 2: [0.9] * n}
    alerts = divergence(state_of(agree, grad_norm=grads, loss=losses))
    assert [(a.rule, a.subject, a.step) for a in alerts] == [("rank_divergence", "rank2", n)]
    assert alerts[0].message.startswith("Rank 2 on node2 is out of sync: the gradients are not")
    assert "(it has grad norms that differ on 20 of the last 20 steps (by up to 25.0%)" in (
        alerts[0].message
    )
    assert "no_sync()" in alerts[0].fix and alerts[0].place == "rank 2 on node2"
    assert alerts[0].evidence["grad_norm"] == {
        "steps_off": 20, "of_steps": 20, "max_relative_difference": 0.25, "newest": [2.5],
    }  # fmt: skip
    far = {0: [1.0] * n, 1: [1.0] * n, 2: [5.0] * n}
    alerts = divergence(state_of(agree, grad_norm={r: [2.0] * n for r in agree}, loss=far))
    assert [a.subject for a in alerts] == ["rank2"] and "loss far from" in alerts[0].message
    same = divergence(state_of(agree, grad_norm={r: [2.0] * n for r in agree}, loss=losses))
    assert same == []
    # Two ranks, or no majority: every rank differs alike, named together, once.
    pair = {0: [1.0] * n, 1: [1.0] * n}
    alerts = divergence(state_of(pair, grad_norm={0: [2.0] * n, 1: [3.0] * n}))
    assert [a.subject for a in alerts] == ["rank0"]
    assert alerts[0].message.startswith("Ranks 0 and 1 on node0 and node1 are out of sync")
    assert "(they have grad norms that differ on 20 of the last 20 steps" in alerts[0].message
    # Rounding (1e-6) is agreement; an infinite norm on one rank is named at once.
    close = {0: [2.0] * n, 1: [2.0 * (1 + 1e-6)] * n}
    assert divergence(state_of(pair, grad_norm=close)) == []
    inf = {0: [2.0] * n, 1: [2.0] * 5 + [math.inf] + [2.0] * (n - 6)}
    alerts = divergence(state_of(pair, grad_norm=inf))
    assert [a.subject for a in alerts] == ["rank1"]
    assert "its grad_norm is infinite at step 6" in alerts[0].message


def ranks(step_time: np.ndarray, wait: np.ndarray | None = None) -> RankColumns:
    r = step_time.shape[0]
    steps = np.arange(1.0, step_time.shape[1] + 1)
    return RankColumns(tuple(range(r)), tuple(f"node{i}" for i in range(r)), steps, step_time, wait)


# Steps a straggler must hold before it is named: its first window, then PERSIST_STEPS more.
HELD = PERSIST_STEPS + MIN_STEPS


def test_straggler_by_data_wait_when_step_times_agree() -> None:
    rng = np.random.default_rng(0)
    n = 150
    times = np.full((4, n), 0.1) + rng.normal(0, 1e-3, (4, n))
    wait = np.abs(rng.normal(0.002, 5e-4, (4, n)))
    wait[2] += 0.03  # rank 2 comes 30 ms late to every all-reduce
    found = stragglers(ranks(times, wait))
    assert list(found) == [2] and found[2][0] == "phase_data_s"
    alerts = Health(rules=(Stragglers,)).check(
        HealthInput(step=n, time=0.0, steps={}, ranks=ranks(times, wait))
    )
    assert [a.subject for a in alerts] == ["rank2"] and "node2" in alerts[0].message
    assert "for over 100 steps" in alerts[0].message


def test_straggler_by_step_time_and_quiet_on_noise() -> None:
    rng = np.random.default_rng(1)
    times = 0.1 + rng.normal(0, 0.005, (3, 150))
    assert stragglers(ranks(times)) == {}  # noise: nobody
    times[0] += 0.02
    assert list(stragglers(ranks(times))) == [0]
    assert list(stragglers(ranks(times[:, :HELD]))) == [0]
    assert stragglers(ranks(times[:, : HELD - 1])) == {}  # not held long enough yet
    assert stragglers(ranks(times[:1])) == {}  # one rank


def test_no_straggler_in_a_noisy_job_whose_ranks_each_have_a_slow_spell() -> None:
    # Four ranks with noisy step times, each slowed 30 ms for one spell of 80 steps in turn (a
    # checkpoint, a busy neighbour): judged as a live job is, every few steps, nobody is named
    # (without persistence the rule named each of them, at steps 94, 227, 360 and 486).
    rng = np.random.default_rng(2)
    n, spell = 600, 80
    times = 0.1 + np.abs(rng.normal(0, 0.01, (4, n)))
    wait = np.abs(rng.normal(0.002, 1e-3, (4, n)))
    for rank in range(4):
        start = 60 + rank * 130
        wait[rank, start : start + spell] += 0.03
    health = Health(rules=(Stragglers,))
    alerts = []
    for end in range(MIN_STEPS, n + 1, 7):
        part = ranks(times[:, :end], wait[:, :end])
        alerts += health.check(HealthInput(step=end, time=0.0, steps={}, ranks=part))
    assert alerts == []
    window = slice(60 + 2 * 130 + spell - WINDOW, 60 + 2 * 130 + spell)  # inside rank 2's spell
    assert list(stragglers(ranks(times[:, window], wait[:, window]))) == []  # too few steps
    held = stragglers(ranks(np.tile(times[:, window], 3), np.tile(wait[:, window], 3)))
    assert list(held) == [2]  # the same spell, held for 150 steps: a straggler


def test_a_job_on_disk(tmp_path: pathlib.Path) -> None:
    job_dir = write_job(tmp_path / "runs", slow=1)
    assert job_dir.name == "j1-Net" and is_job(job_dir)
    assert sorted(rank_dirs(job_dir)) == [0, 1]
    job = nbmonitor.open(job_dir)
    assert isinstance(job, Job) and job.status == "closed" and job.world_size == 2
    assert job.history(1)["phase_data_s"][0] == 0.021
    assert [a.subject for a in job.alerts()] == ["rank1"]
    before = sorted(p.relative_to(job_dir) for p in job_dir.rglob("*"))
    assert job.summary()["process_rss_bytes"]["max_rank"] == 1
    # Reading never writes into the folder it reads: the summary is computed in memory.
    assert sorted(p.relative_to(job_dir) for p in job_dir.rglob("*")) == before
    assert not (job_dir / "ranks_summary.json").exists()
    text = finish(job_dir)  # the writer's rank 0 at close writes it
    record = json.loads((job_dir / "ranks_summary.json").read_text())
    assert record["summary"]["phase_data_s"]["max_rank"] == 1 and record["status"] == "closed"
    assert text is not None and "phase_data_s" in text and "Rank 1 on node1" in text
    table = list_runs(tmp_path / "runs")
    assert [row["name"] for row in table] == ["j1-Net"]
    assert table[0]["steps"] == JOB_STEPS and "2/2 ranks" in str(table[0]["backend"])
    # A rank's own folder still opens as an ordinary run.
    assert not isinstance(nbmonitor.open(job_dir / "rank0"), Job)
    assert finish(job_dir / "rank0") is None


def test_no_straggler_in_a_balanced_job(tmp_path: pathlib.Path) -> None:
    job = nbmonitor.open(write_job(tmp_path / "runs", slow=None))
    assert isinstance(job, Job) and job.alerts() == []
    columns = rank_columns(job.state())
    assert columns is not None and columns.data_wait is not None


def test_claiming_rank_folders(tmp_path: pathlib.Path) -> None:
    job, rank0 = claim_rank_dir(tmp_path, "My Net", "abc", 0)
    assert job.name == "abc-My-Net" and rank0 == job / "rank0"
    assert claim_rank_dir(tmp_path, "My Net", "abc", 1)[0] == job
    again, _ = claim_rank_dir(tmp_path, "My Net", "abc", 0)  # rank 0 of a second launch
    assert again.name == "abc-My-Net-2"


def test_following_a_job_picks_up_ranks_as_they_start(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "runs"
    tail = JobTail(root / "j2-Net")  # before the job exists
    assert tail.poll() == {} and not tail.closed
    logs = {0: RunLogSink.create(root, "Net", {}, job_id="j2", rank=0, world_size=2)}
    logs[0].write_steps([{"step": 1.0, "step_time": 0.1}])
    logs[0].flush()
    assert list(tail.poll()) == [0] and tail.world_size == 2
    logs[1] = RunLogSink.create(root, "Net", {}, job_id="j2", rank=1, world_size=2)
    logs[1].write_steps([{"step": 1.0, "step_time": 0.2}, {"step": 2.0, "step_time": 0.2}])
    logs[1].flush()
    new = tail.poll()
    assert list(new) == [1] and len(new[1]["steps"]) == 2
    logs[0].close({"status": "closed"})
    tail.poll()
    assert not tail.closed  # rank 1 still runs
    logs[1].close({"status": "closed"})
    tail.poll()
    assert tail.closed


def test_a_folder_left_by_an_earlier_partial_launch_is_passed_over(tmp_path: pathlib.Path) -> None:
    # An earlier launch with this id where only rank 0 attached (an hour ago): rank 1 of the new
    # launch must not join it, or the new job would be split across two folders.
    job, rank0 = claim_rank_dir(tmp_path, "Net", "fixed", 0)
    (rank0 / "meta.json").write_text(json.dumps({"start_timestamp": time.time() - 3600}))
    again, _ = claim_rank_dir(tmp_path, "Net", "fixed", 1)
    assert again.name == "fixed-Net-2"
    # A rank of this launch that started just now is joined.
    job2, rank0b = claim_rank_dir(tmp_path, "Other", "fresh", 0)
    (rank0b / "meta.json").write_text(json.dumps({"start_timestamp": time.time()}))
    assert claim_rank_dir(tmp_path, "Other", "fresh", 1)[0] == job2
