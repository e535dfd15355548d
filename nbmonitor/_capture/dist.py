"""Which rank of a distributed job this process is: read from the environment that ``torchrun``
(or a cluster scheduler) sets, or from an initialised process group. Never a collective.

Every rank must find the same job id on its own, without talking to the others (a collective
at attach could hang the job if one rank never attaches, and none may run on the training
thread). The id, first found wins:

1. ``NBMONITOR_JOB_ID``, for launchers that set nothing else;
2. ``TORCHELASTIC_RUN_ID`` (``torchrun --rdzv-id``; a fresh UUID for ``--standalone`` and for
   single-node runs without ``--master-port``), unless it is torchrun's default ``"none"``;
3. the scheduler's job: ``SLURM_JOB_ID`` (with ``SLURM_STEP_ID``), ``PBS_JOBID``,
   ``LSB_JOBID``;
4. on one node only: the launcher (the parent process every rank shares), by its pid and its
   start time, with ``MASTER_ADDR``/``MASTER_PORT``. Ranks on other nodes cannot see it: for
   multi-node jobs set one of the above.

A restarted attempt (``TORCHELASTIC_RESTART_COUNT`` > 0) is a job of its own. Reading the
process group (``get_rank``, ``get_world_size``) is a local call; torch is imported here only
if the caller already imported ``torch.distributed``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import pathlib
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

# torchrun's placeholder when no --rdzv-id is given with --master-port: not an id at all.
_NO_ID = ("", "none")


@dataclass(frozen=True)
class RankInfo:
    """This process's place in a distributed job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    job_id: str  # shared by every rank of the job (see the module docstring)
    host: str

    def as_meta(self) -> dict[str, object]:
        """The fields meta.json carries for a rank."""
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "job_id": self.job_id,
            "hostname": self.host,
        }


def _int(env: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(env[key])
    except (KeyError, ValueError):
        return None
    return value if value >= 0 else None


def _process_group() -> tuple[int, int] | None:
    """(rank, world size) of an initialised default process group: local calls only."""
    if "torch.distributed" not in sys.modules:
        return None
    dist = sys.modules["torch.distributed"]
    try:
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-torn-down group: treat as none
        return None
    return None


def _started(pid: int) -> float | None:
    """Start time of process ``pid`` (seconds since the epoch), from /proc; None elsewhere."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(line.split()[1])
            for line in pathlib.Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        ticks = float(stat.rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def job_id(env: Mapping[str, str]) -> str:
    """The id every rank of this job finds alike (see the module docstring)."""
    found = env.get("NBMONITOR_JOB_ID", "").strip()
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if not found and run_id not in _NO_ID:
        found = run_id[:8] if len(run_id) == 36 and run_id.count("-") == 4 else run_id
    if not found and env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID")
        found = f"slurm{env['SLURM_JOB_ID']}" + (f".{step}" if step else "")
    for key, prefix in (("PBS_JOBID", "pbs"), ("LSB_JOBID", "lsf")):
        if not found and env.get(key):
            found = f"{prefix}{env[key]}"
    if not found:
        # One node: the launcher every rank was started by. Its start time tells one launch
        # from the next (pids are reused); the master address keeps two launchers apart.
        parent = os.getppid()
        started = _started(parent)
        where = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}:{parent}:{started}"
        digest = hashlib.sha1(where.encode()).hexdigest()[:6]
        stamp = _dt.datetime.fromtimestamp(started) if started is not None else None
        found = f"{stamp:%Y%m%d-%H%M%S}-{digest}" if stamp is not None else digest
    restarts = _int(env, "TORCHELASTIC_RESTART_COUNT")
    return f"{found}-restart{restarts}" if restarts else found


def rank_info(env: Mapping[str, str] | None = None) -> RankInfo | None:
    """This process's rank, or None when it is not one of several (a single-process run).

    From an initialised process group when there is one (authoritative for rank and world
    size), else from ``RANK`` / ``WORLD_SIZE``; ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` when
    set. A world of one is not distributed.
    """
    env = os.environ if env is None else env
    group = _process_group()
    if group is not None:
        rank, world = group
    else:
        rank_env, world_env = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        if rank_env is None or world_env is None:
            return None
        rank, world = rank_env, world_env
    if world <= 1 or rank >= world:
        return None
    local_rank = _int(env, "LOCAL_RANK")
    local_world = _int(env, "LOCAL_WORLD_SIZE")
    return RankInfo(
        rank=rank,
        local_rank=local_rank if local_rank is not None else rank,
        world_size=world,
        local_world_size=local_world if local_world else world,
        job_id=job_id(env),
        host=socket.gethostname(),
    )


__all__ = ["RankInfo", "job_id", "rank_info"]
