"""For the tests in this folder (no torch): a two-rank job written as attach() writes it, and
two real rank processes started as torchrun starts them (gloo on 127.0.0.1)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import uuid

from nbmonitor.sinks import RunLogSink

# Long enough for the straggler rule's persistence (PERSIST_STEPS beyond its first window).
JOB_STEPS = 120


def write_job(root: pathlib.Path, slow: int | None, steps: int = JOB_STEPS) -> pathlib.Path:
    """Two ranks written as attach() writes them, rank ``slow`` waiting 20 ms longer."""
    job = None
    for rank in (0, 1):
        meta = {"rank": rank, "world_size": 2, "hostname": f"node{rank}", "device": "cpu"}
        log = RunLogSink.create(root, "Net", meta, job_id="j1", rank=rank, world_size=2)
        rows = [
            # Each rank's own batches: losses close, not equal (equal ones: same_batches).
            {"step": float(s), "time": 100.0 + s, "step_time": 0.05, "loss": 1.0 / s + 0.01 * rank,
             "grad_norm": 2.0, "phase_data_s": 0.021 if rank == slow else 0.001}
            for s in range(1, steps + 1)
        ]  # fmt: skip
        log.write_steps(rows)
        log.write_samples([{"step": 1.0, "process_rss_bytes": 1e9 * (rank + 1)}])
        log.close({"status": "closed", "end_time": "x", "steps": steps})
        job = log.path.parent
    assert job is not None
    return job


ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(
    tmp: pathlib.Path, script: pathlib.Path, args: list[str], id_prefix: str
) -> tuple[pathlib.Path, list[subprocess.Popen[bytes]], list[pathlib.Path]]:
    """Ranks 0 and 1 of one job running ``script runs *args`` with torchrun's variables (a job
    id of their own, a free port, one thread each), output to ``tmp/rank<r>.log``: the job's
    folder, the processes and their logs."""
    job_id = f"{id_prefix}{uuid.uuid4().hex[:8]}"
    runs = tmp / "runs"
    port = free_port()
    logs = [tmp / f"rank{r}.log" for r in (0, 1)]
    procs: list[subprocess.Popen[bytes]] = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NBMONITOR_JOB_ID": job_id,
            "OMP_NUM_THREADS": "1",
        }
        for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
            env.pop(key, None)
        with logs[rank].open("wb") as out:
            command = [sys.executable, str(script), str(runs), *args]
            procs.append(subprocess.Popen(command, env=env, stdout=out, stderr=out))
    return runs / f"{job_id}-DistributedDataParallel", procs, logs
