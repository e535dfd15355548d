"""A real two-rank DDP job under torchrun (gloo, CPU), followed from this process while it runs:
one job folder with a run per rank, only rank 0 prints, no collective from nbmonitor, the
cross-rank table and summary, and the rank that sleeps every step named as a straggler."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from tests.helpers import wait_for

import nbmonitor
from nbmonitor.replay import Follow, Job

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("ddp_train.py")
STEPS = 120  # the straggler must hold for over 100 steps (PERSIST_STEPS)


class Recorder:
    """A ranks view that keeps what it was given."""

    wants_detail = True

    def __init__(self) -> None:
        self.frames: list[object] = []
        self.closed: object = None

    def publish(self, frame: object) -> None:
        self.frames.append(frame)

    def close(self, frame: object) -> None:
        self.closed = frame


@pytest.mark.slow
def test_torchrun_two_ranks(tmp_path: pathlib.Path) -> None:
    job_id = f"t{uuid.uuid4().hex[:8]}"
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "NBMONITOR_JOB_ID": job_id,
        "OMP_NUM_THREADS": "1",
    }
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    args = [str(runs), str(STEPS), "1", "0.03"]  # rank 1 sleeps 30 ms before each step
    cmd = [*launcher, f"--log-dir={logs}", "--redirects=3", str(SCRIPT), *args]
    job_dir = runs / f"{job_id}-DistributedDataParallel"
    # Followed from here while it runs, as a notebook's nbmonitor.tail(job_dir) would.
    view = Recorder()
    follow = Follow(job_dir, [view], interval=0.2, job=True)
    follow.start()
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=100, check=False
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        wait_for(lambda: not follow.running)
    finally:
        follow.stop()
    assert view.closed is not None, follow.errors

    # One job folder, a run per rank, each meta.json saying which rank wrote it.
    assert sorted(p.name for p in runs.iterdir()) == [job_dir.name]
    # (and the job's control folder, where a request to every rank goes: docs/steering.md)
    assert sorted(p.name for p in job_dir.iterdir() if p.is_dir()) == [
        "control",
        "rank0",
        "rank1",
    ]
    for rank in (0, 1):
        meta = json.loads((job_dir / f"rank{rank}" / "meta.json").read_text())
        assert (meta["rank"], meta["local_rank"], meta["world_size"]) == (rank, rank, 2)
        assert meta["hostname"] == socket.gethostname() and meta["device"] == "cpu"
        assert meta["job_id"] == job_id and meta["status"] == "closed"

    # Only rank 0 prints: its status line, closing summary and the cross-rank summary.
    out = {r: _rank_output(logs, r) for r in (0, 1)}
    assert "nbmonitor:" in out[0] and "cross-rank summary" in out[0]
    assert "nbmonitor" not in out[1].replace(str(runs), "")
    # Not one collective from attach to close, on either rank; the counter does see one.
    for rank in (0, 1):
        assert "collectives 0 []" in out[rank], out[rank]
        assert re.search(r"after barrier [1-9]", out[rank]), out[rank]

    # The cross-rank view of the finished job.
    job = nbmonitor.open(job_dir)
    assert isinstance(job, Job) and sorted(job.ranks) == [0, 1] and job.status == "closed"
    table = job.per_step()
    assert np.array_equal(table["step"], np.arange(1, STEPS + 1))
    assert np.all(table["min"] <= table["median"]) and np.all(table["median"] <= table["max"])
    assert set(np.unique(table["slowest_rank"])) <= {0.0, 1.0}
    summary = job.summary()
    wait = summary["phase_data_s"]
    assert wait["count"] == 2 and wait["max_rank"] == 1 and wait["min_rank"] == 0
    assert wait["max"] > 0.02 > wait["min"]
    assert summary["step_time"]["count"] == 2
    written = json.loads((job_dir / "ranks_summary.json").read_text())
    assert written["summary"]["phase_data_s"]["max_rank"] == 1
    assert set(written["ranks"]) == {"0", "1"}

    # The straggler, named with its host: offline, live (the tail) and in rank 0's summary.
    host = socket.gethostname()
    alerts = job.alerts()
    # DDP ranks share their gradients after the all-reduce: their grad norms agree.
    assert not [a for a in alerts if a.rule == "rank_divergence"], alerts
    assert np.array_equal(job.history(0)["grad_norm"], job.history(1)["grad_norm"])
    stragglers = [a for a in alerts if a.rule == "straggler"]
    assert [a.subject for a in stragglers] == ["rank1"]
    assert f"Rank 1 on {host}" in stragglers[0].message
    assert f"Rank 1 on {host} is a straggler" in out[0]
    # Rank 0 found it live too, following the other rank's steps file: in its own events.
    events = [
        json.loads(x) for x in (job_dir / "rank0" / "events.jsonl").read_text().split("\n") if x
    ]
    assert [e["subject"] for e in events if e.get("rule") == "straggler"] == ["rank1"]
    final = view.closed
    assert [a.subject for a in final.alerts if a.rule == "straggler"] == ["rank1"]  # type: ignore[attr-defined]
    assert final.ranks == (0, 1) and final.heat.shape == (2, STEPS)  # type: ignore[attr-defined]
    assert view.frames, "the tail published frames while the job ran"


def _rank_output(logs: pathlib.Path, rank: int) -> str:
    found = sorted(logs.rglob(f"attempt_0/{rank}/std*.log"))
    assert found, list(logs.rglob("*"))
    return "".join(p.read_text() for p in found)
