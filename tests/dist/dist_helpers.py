"""A two-rank job written as attach() writes it, for the tests in this folder (no torch)."""

from __future__ import annotations

import pathlib

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
