"""Steering a real two-rank job (gloo on 127.0.0.1, one process per rank, tests/dist/steer_job.py)
with no collective from nbmonitor: a checkpoint asked on one rank's monitor and a stop asked
with ``nbmonitor ctl JOB stop`` each name a step ahead in the job folder; every rank's sampler
reads it and acts at exactly that step's end: both ranks' checkpoints are of the same step,
both loops end at the same step (no rank left waiting in a collective), both runs ``stopped``
with the same last step, and both processes exit 0."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from tests.dist.dist_helpers import ROOT, launch_ranks
from tests.helpers import wait_for

import nbmonitor

SCRIPT = pathlib.Path(__file__).with_name("steer_job.py")
ASK_AT = 30  # rank 1 asks its monitor for a checkpoint at the end of this step
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def start(
    tmp: pathlib.Path, ask_at: int = ASK_AT
) -> tuple[pathlib.Path, list[subprocess.Popen[bytes]], list[pathlib.Path]]:
    return launch_ranks(tmp, SCRIPT, [str(ask_at)], "s")


def ctl(job_dir: pathlib.Path, request: str) -> str:
    """``nbmonitor ctl JOB request`` from a shell; what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "nbmonitor", "ctl", str(job_dir), request],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def steer_events(run_dir: pathlib.Path) -> list[tuple[int, str]]:
    path = run_dir / "events.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except ValueError:  # the line being written
            continue
        if event.get("rule") == "steer":
            found.append((event["step"], event["evidence"]["action"]))
    return found


def last_step(run_dir: pathlib.Path) -> int:
    try:
        steps = nbmonitor.open(run_dir).history()["step"]
    except Exception:
        return 0
    return int(steps[-1]) if len(steps) else 0


def test_a_job_is_checkpointed_and_stopped_at_the_same_step_on_every_rank(
    tmp_path: pathlib.Path,
) -> None:
    job_dir, procs, logs = start(tmp_path)
    try:
        ranks = [job_dir / "rank0", job_dir / "rank1"]
        # Rank 1's checkpoint, asked at step 30, lands on both ranks at one step past it.
        assert wait_for(lambda: all(any((r / "checkpoints").glob("step-*.pt")) for r in ranks))
        # Stopped from a shell, as a user would (the CLI reads the ranks' files for the step).
        ctl = subprocess.run(
            [sys.executable, "-m", "nbmonitor", "ctl", str(job_dir), "stop"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert ctl.returncode == 0, ctl.stdout + ctl.stderr
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

    # The checkpoints: one per rank, of the same step, after the step it was asked at.
    found = [sorted(p.name for p in (r / "checkpoints").glob("step-*.pt")) for r in ranks]
    assert found[0] == found[1] and len(found[0]) == 1, found
    ckpt_step = int(found[0][0].removeprefix("step-").removesuffix(".pt"))
    assert ckpt_step > ASK_AT
    for r in ranks:
        state = torch.load(r / "checkpoints" / found[0][0], weights_only=False)
        assert state["step"] == ckpt_step and {"model", "optimizer"} <= set(state)

    # The stop: the same step on both ranks, the step ctl named.
    said = [log.read_text() for log in logs]
    stops = [int(text.split("loop ended by the stop at ")[1].split()[0]) for text in said]
    assert stops[0] == stops[1] > ckpt_step, said
    asked = ctl.stdout
    assert f"at the end of step {stops[0]} " in asked, asked
    for r in ranks:
        meta = json.loads((r / "meta.json").read_text())
        assert meta["status"] == "stopped" and meta["last_step"] == stops[0]
        assert last_step(r) == stops[0]
        events = [json.loads(line) for line in (r / "events.jsonl").read_text().splitlines()]
        steer = [(e["step"], e["evidence"]["action"]) for e in events if e.get("rule") == "steer"]
        assert steer == [(ckpt_step, "checkpoint"), (stops[0], "stop")], steer
    assert nbmonitor.open(job_dir).status == "stopped"


def test_a_paused_job_takes_a_learning_rate_and_a_stop_at_the_step_it_paused_at(
    tmp_path: pathlib.Path,
) -> None:
    # While the job is paused every rank sits at the same step's end; what is asked then (a
    # learning rate, then a stop, each naming a step ahead that no rank reaches) applies there
    # on every rank.
    job_dir, procs, logs = start(tmp_path, ask_at=0)
    ranks = [job_dir / "rank0", job_dir / "rank1"]
    try:
        assert wait_for(lambda: all(last_step(r) >= 20 for r in ranks))
        ctl(job_dir, "pause")
        assert wait_for(lambda: all(steer_events(r) for r in ranks))
        paused = {steer_events(r)[0] for r in ranks}
        assert len(paused) == 1, paused  # the same step on both ranks
        [(step, action)] = paused
        assert action == "pause" and all(p.poll() is None for p in procs)
        ctl(job_dir, "lr=0.5")
        ctl(job_dir, "stop")
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    for r, log in zip(ranks, logs, strict=True):
        assert f"loop ended by the stop at {step} " in log.read_text()
        assert steer_events(r) == [(step, "pause"), (step, "lr"), (step, "stop")]
        assert json.loads((r / "meta.json").read_text())["last_step"] == step == last_step(r)
