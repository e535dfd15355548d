"""Ranks launched together never race for folder names: 20 launches of two rank processes
(started with torchrun's environment, released at the same instant) each give one job folder
holding rank0/ and rank1/; a job id launched again moves to the next folder, all ranks alike."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = pathlib.Path(__file__).with_name("claim_rank.py")
# Where a job id may come from (nbmonitor/_capture/dist.py): none leaks in from outside.
ID_VARS = ("NBMONITOR_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")


def launch(runs: pathlib.Path, env_extra: dict[str, str], world: int = 2) -> list[pathlib.Path]:
    """Start one process per rank, as torchrun would, released at the same wall time."""
    start_at = time.time() + 1.0
    procs = []
    for rank in range(world):
        env = {
            **{k: v for k, v in os.environ.items() if k not in ID_VARS},
            "PYTHONPATH": str(ROOT),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            **env_extra,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPT), str(runs), str(start_at)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    paths = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        paths.append(pathlib.Path(out.strip()))
    return paths


def test_twenty_launches_one_job_folder_each(tmp_path: pathlib.Path) -> None:
    runs = tmp_path / "runs"
    ids = [str(uuid.uuid4()) for _ in range(20)]  # as torchrun --standalone sets
    jobs = []
    # Four launches at a time: the ranks of several jobs collide as well as those of one.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(launch, runs, {"TORCHELASTIC_RUN_ID": i}) for i in ids]
        for run_id, future in zip(ids, futures, strict=True):
            paths = future.result(timeout=100)
            assert [p.name for p in paths] == ["rank0", "rank1"]
            assert paths[0].parent == paths[1].parent
            assert paths[0].parent.name == f"{run_id[:8]}-Net"
            jobs.append(paths[0].parent)
    assert len(set(jobs)) == 20
    assert sorted(p.name for p in runs.iterdir()) == sorted(j.name for j in jobs)
    for job in jobs:
        assert sorted(p.name for p in job.iterdir()) == ["meta.json", "rank0", "rank1"]


def test_the_same_job_id_again_takes_the_next_folder(tmp_path: pathlib.Path) -> None:
    runs = tmp_path / "runs"
    first = launch(runs, {"NBMONITOR_JOB_ID": "exp7"})
    second = launch(runs, {"NBMONITOR_JOB_ID": "exp7"})
    assert {p.parent.name for p in first} == {"exp7-Net"}
    assert {p.parent.name for p in second} == {"exp7-Net-2"}


def test_without_an_id_the_ranks_of_one_launcher_share_a_folder(tmp_path: pathlib.Path) -> None:
    # No TORCHELASTIC_RUN_ID (torchrun --master-port leaves "none"): the launcher (this test
    # process, the parent of both ranks) and its start time name the job on this node.
    runs = tmp_path / "runs"
    paths = launch(runs, {"TORCHELASTIC_RUN_ID": "none"})
    assert paths[0].parent == paths[1].parent
    assert paths[0].parent.name.endswith("-Net")
