"""Which rank a process is, from the environment or an initialised process group, and the job
id every rank finds alike; never a collective."""

from __future__ import annotations

import os
import sys
import types

import pytest

from nbmonitor._capture.dist import job_id, rank_info

TORCHRUN = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RUN_ID": "0c9f3f7e-1111-2222-3333-444455556666",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_torchrun_environment() -> None:
    info = rank_info(TORCHRUN)
    assert info is not None
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (1, 1, 4, 2)
    assert info.job_id == "0c9f3f7e"  # a UUID (torchrun --standalone) is cut to 8 hex digits
    meta = info.as_meta()
    assert meta["rank"] == 1 and meta["world_size"] == 4 and meta["hostname"] == info.host


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"RANK": "0"},  # no world size
        {"RANK": "0", "WORLD_SIZE": "1"},  # a world of one is a single run
        {"RANK": "x", "WORLD_SIZE": "2"},
        {"RANK": "2", "WORLD_SIZE": "2"},  # out of range
        {"RANK": "-1", "WORLD_SIZE": "2"},
    ],
)
def test_not_a_rank(env: dict[str, str]) -> None:
    assert rank_info(env) is None


def test_job_id_sources_in_order() -> None:
    assert job_id({**TORCHRUN, "NBMONITOR_JOB_ID": "exp7"}) == "exp7"
    assert job_id({"TORCHELASTIC_RUN_ID": "myjob"}) == "myjob"
    assert job_id({"SLURM_JOB_ID": "123", "SLURM_STEP_ID": "0"}) == "slurm123.0"
    assert job_id({"PBS_JOBID": "9.pbs"}) == "pbs9.pbs"
    assert job_id({"LSB_JOBID": "77"}) == "lsf77"
    assert job_id({"TORCHELASTIC_RUN_ID": "myjob", "TORCHELASTIC_RESTART_COUNT": "2"}) == (
        "myjob-restart2"
    )


def test_without_an_id_the_launcher_names_the_job() -> None:
    # torchrun --master-port leaves the run id "none": the parent process (the launcher every
    # local rank shares) and its start time stand in; the same for both ranks, not for another
    # master port.
    env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    first = job_id({**env, "RANK": "0"})
    assert first == job_id({**env, "RANK": "1"})
    assert first != job_id({**env, "MASTER_PORT": "2"})
    assert first.count("-") == 2  # <YYYYmmdd-HHMMSS>-<digest>


def test_an_initialised_process_group_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only local calls are made: is_available, is_initialized, get_rank, get_world_size.
    called: list[str] = []

    def local(name: str, value: object) -> object:
        def call(*_: object) -> object:
            called.append(name)
            return value

        return call

    fake = types.SimpleNamespace(
        is_available=local("is_available", True),
        is_initialized=local("is_initialized", True),
        get_rank=local("get_rank", 3),
        get_world_size=local("get_world_size", 8),
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    info = rank_info({"TORCHELASTIC_RUN_ID": "j"})
    assert info is not None and (info.rank, info.world_size, info.local_rank) == (3, 8, 3)
    assert sorted(called) == ["get_rank", "get_world_size", "is_available", "is_initialized"]


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    info = rank_info()
    assert info is not None and info.rank == 1
    assert os.environ["RANK"] == "1"
