"""Following a job ends when no rank can write any more: every rank's writer (a real process,
killed here) is gone or closed, and the ranks that never appeared had their time. The same
end as a single run's follow (``Tail.ended``), in the API, the follower and the CLI."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nbmonitor.replay.follow import Follow
from nbmonitor.runs.job import JobTail

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}

# One rank of a job, written as attach() writes it: two steps, then it waits to be killed
# ("kill") or closes its run and exits ("close").
WRITER = """
import sys, time
from nbmonitor.sinks import RunLogSink
root, rank, world, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
log = RunLogSink.create(root, "Net", {}, job_id="jk", rank=rank, world_size=world)
log.write_steps([{"step": 1.0, "step_time": 0.1}, {"step": 2.0, "step_time": 0.1}])
log.flush()
if mode == "close":
    log.close({"status": "closed", "steps": 2})
print("ready", flush=True)
if mode == "kill":
    time.sleep(600)
"""


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def writers(tmp_path: pathlib.Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(rank: int, world: int = 2, mode: str = "kill") -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / "runs"), str(rank), str(world), mode],
            stdout=subprocess.PIPE,
            env=ENV,
        )
        started.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"  # its rank folder and steps are written
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(60)
        assert proc.stdout is not None
        proc.stdout.close()


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(60)  # reaped: its pid is gone


def job_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "runs" / "jk-Net"


def test_a_job_tail_ends_once_every_ranks_writer_was_killed(
    tmp_path: pathlib.Path, writers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    rank0, rank1 = writers(0), writers(1)
    tail = JobTail(job_dir(tmp_path))
    new = tail.poll()
    assert sorted(new) == [0, 1] and all(len(new[r]["steps"]) == 2 for r in new)
    assert tail.ended is None  # both writers alive
    kill(rank0)
    tail.poll()
    tail.poll()
    assert tail.tails[0].ended == f"its writer (pid {rank0.pid}) is gone"
    assert tail.ended is None and not tail.closed  # rank 1 still writes
    kill(rank1)
    wait_for(lambda: tail.poll() == {} and tail.ended, "the job's end")
    assert tail.ended == (
        f"no rank is writing any more (rank 0: its writer (pid {rank0.pid}) is gone; "
        f"rank 1: its writer (pid {rank1.pid}) is gone)"
    )
    assert not tail.closed


def test_a_killed_rank_beside_a_closed_one_ends_the_follow(
    tmp_path: pathlib.Path, writers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    writers(1, mode="close")
    rank0 = writers(0)

    class View:
        def __init__(self) -> None:
            self.published = 0
            self.closed: list[Any] = []

        def publish(self, frame: Any) -> None:
            self.published += 1

        def close(self, frame: Any) -> None:
            self.closed.append(frame)

    view = View()
    follow = Follow(job_dir(tmp_path), [view], interval=0.05, job=True)
    follow.start()
    try:
        wait_for(lambda: view.published >= 2, "frames while rank 0 runs")
        assert follow.running and not view.closed
        kill(rank0)
        wait_for(lambda: not follow.running, "the follower to end")
    finally:
        follow.stop()
    assert len(view.closed) == 1 and follow.errors == []
    assert view.closed[0].status == "killed"  # a rank's writer gone is no closed job
    assert isinstance(follow.tail, JobTail)
    assert follow.tail.ended == (
        f"no rank is writing any more (rank 0: its writer (pid {rank0.pid}) is gone; rank 1 closed)"
    )


def test_a_rank_that_never_appears_is_waited_for_then_named(
    tmp_path: pathlib.Path, writers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    rank0 = writers(0, world=3)
    kill(rank0)
    patient = JobTail(job_dir(tmp_path))  # the missing ranks may still attach for a minute
    done = JobTail(job_dir(tmp_path), missing_s=0.0)
    for tail in (patient, done):
        wait_for(lambda t=tail: t.poll() == {} and t.tails[0].ended, "rank 0's end")
    assert patient.ended is None
    assert done.ended == (
        f"no rank is writing any more (rank 0: its writer (pid {rank0.pid}) is gone; "
        "ranks 1, 2 never appeared)"
    )


def test_a_huge_world_size_from_meta_json_names_a_few_ranks(tmp_path: pathlib.Path) -> None:
    """meta.json is untrusted: a world size of 10^15 costs nothing and ends as any other."""
    import json

    from nbmonitor.sinks import RunLogSink

    log = RunLogSink.create(tmp_path / "runs", "Net", {}, job_id="jk", rank=0, world_size=2)
    log.close({"status": "closed"})
    meta = job_dir(tmp_path) / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "world_size": 10**15}))
    tail = JobTail(job_dir(tmp_path), missing_s=0.0)
    tail.poll()
    assert not tail.closed
    assert tail.ended == (
        "no rank is writing any more (rank 0 closed; ranks 1, 2, 3 and 999999999999996 more "
        "never appeared)"
    )


def test_the_tail_command_ends_on_a_job_whose_writers_were_killed(
    tmp_path: pathlib.Path, writers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    kill(writers(0))
    kill(writers(1))
    proc = subprocess.run(
        [sys.executable, "-m", "nbmonitor", "tail", str(job_dir(tmp_path)), "--interval", "0.2"],
        capture_output=True,
        timeout=120,
        env=ENV,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().strip().splitlines()[-1] == (
        "nbmonitor tail: jk-Net: 2 steps; stopped following: every rank's writer is gone or "
        "closed, and the job never closed (killed)"
    )


def test_a_job_folder_whose_ranks_never_wrote_a_run_ends(tmp_path: pathlib.Path) -> None:
    """The job's meta.json is there (a rank claimed its folder, then died before writing its
    run): once the ranks had their time, the follow ends instead of waiting forever."""
    from nbmonitor.runs.layout import job_meta, write_job_meta

    job = job_dir(tmp_path)
    job.mkdir(parents=True)
    (job / "rank0").mkdir()
    write_job_meta(job, job_meta("Net", "jk", 2))
    assert JobTail(job).poll() == {}
    patient, done = JobTail(job), JobTail(job, missing_s=0.0)
    for tail in (patient, done):
        assert tail.poll() == {}
    assert patient.ended is None
    assert done.ended is not None and done.ended.startswith("no rank appeared in ")
    before_the_job = JobTail(tmp_path / "runs" / "later", missing_s=0.0)
    before_the_job.poll()
    assert before_the_job.ended is None  # no job folder yet: it may still be made
