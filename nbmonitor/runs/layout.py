"""The layout of a distributed job on disk: one job folder, one run folder per rank inside it.

```
runs/<job>-<name>/          the job: meta.json with "layout": "ranks" (written by every rank)
  rank0/  rank1/ ...        one ordinary run each (meta.json, steps.jsonl, ... see format.py)
  ranks_summary.json        the cross-rank summary, at close and when opened
```

Every rank computes the job folder's name alone from the job id all ranks share
(``nbmonitor._capture.dist``), so nobody races for a name: the job folder is made with
``exist_ok=True`` and each rank then *claims* ``rank<r>/`` with a plain ``mkdir``, which only
one process can win. A rank whose folder is already taken (the same job id launched again)
moves on to ``<job>-<name>-2``, ``-3``...; the ranks of one launch all find the same folders
taken and so all land in the same one; a folder where a rank of an earlier launch is found
(its run started before this process did) is passed over too, so that a launch whose ranks
did not all attach does not capture ranks of the next one. Shared by the writer
(``sinks/runlog.py``) and the readers; stdlib only.
"""

from __future__ import annotations

import os
import pathlib
import re
import time
from typing import Any

from nbmonitor.runs.decode import loads_line
from nbmonitor.runs.files import RunFolder
from nbmonitor.runs.format import (
    FORMAT_VERSION,
    MAX_META_BYTES,
    META,
    RunDirError,
    sanitize_name,
    write_json_atomic,
)
from nbmonitor.runs.status import _started_after

LAYOUT = "ranks"  # meta.json "layout" of a job folder
SUMMARY = "ranks_summary.json"
_RANK_DIR = re.compile(r"^rank([0-9]{1,9})$")  # ASCII digits: "rank²" is no rank
# The folders a rank tries before giving up (a job id launched this many times over).
MAX_ATTEMPTS = 1000
# A rank whose run started this long before this process did is of an earlier launch (the
# processes of one launch start within seconds of each other, across nodes too).
SKEW_S = 60.0


def rank_dir_name(rank: int) -> str:
    """``rank<r>``: the folder of rank ``r`` inside its job folder."""
    return f"rank{rank}"


def job_stem(name: str | None, job_id: str) -> str:
    """``<job>-<name>``: the job folder's name, the same on every rank."""
    return f"{sanitize_name(job_id)}-{sanitize_name(name)}"


def claim_rank_dir(
    root: pathlib.Path, name: str | None, job_id: str, rank: int
) -> tuple[pathlib.Path, pathlib.Path]:
    """Make (or join) the job folder and claim this rank's folder in it; (job, rank folder).

    Raises OSError when the folders cannot be made (the caller turns it into RunDirError).
    """
    stem = job_stem(name, job_id)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        job = root / (stem if attempt == 1 else f"{stem}-{attempt}")
        job.mkdir(parents=True, exist_ok=True)
        if _earlier_launch(job):
            continue  # an earlier launch with this id, whose ranks did not all attach
        try:
            (job / rank_dir_name(rank)).mkdir()
        except FileExistsError:
            continue  # taken by an earlier launch with this job id: the next folder
        return job, job / rank_dir_name(rank)
    raise FileExistsError(f"{root / stem}: rank{rank} taken in {MAX_ATTEMPTS} folders")


def _earlier_launch(job: pathlib.Path) -> bool:
    """Whether a rank in ``job`` started its run well before this process was started: the
    ranks of one launch are started together (after torchrun's rendezvous), so such a rank
    belongs to an earlier launch with the same job id, and this rank must not join it even
    where its own folder is free (that launch's ranks did not all attach)."""
    for folder in rank_dirs(job).values():
        meta = read_json(folder / META)
        started = meta.get("start_timestamp") if isinstance(meta, dict) else None
        if isinstance(started, (int, float)) and _started_after(os.getpid(), started + SKEW_S):
            return True
    return False


def job_meta(name: str | None, job_id: str, world_size: int) -> dict[str, object]:
    """What the job folder's meta.json holds. Every rank writes it (atomically); the fields
    are the same on every rank but the start time, which is whichever rank wrote last."""
    now = time.time()
    return {
        "format_version": FORMAT_VERSION,
        "layout": LAYOUT,
        "name": sanitize_name(name),
        "job_id": job_id,
        "world_size": world_size,
        "ranks": "rank<r>/",
        "start_timestamp": now,
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now)),
    }


def write_job_meta(job: pathlib.Path, meta: dict[str, object]) -> None:
    write_json_atomic(job / META, meta)


def is_job(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a job folder (meta.json with ``"layout": "ranks"``)."""
    meta = read_json(pathlib.Path(path) / META)
    return isinstance(meta, dict) and meta.get("layout") == LAYOUT


def read_json(path: pathlib.Path) -> Any:
    """A JSON file read by the reading contract (a regular file, bounded, depth-limited), or
    None when it is missing, refused or not (yet) valid."""
    try:
        return loads_line(RunFolder(path.parent).read_whole([path.name], MAX_META_BYTES))
    except (OSError, ValueError, RunDirError):
        return None


def rank_dirs(job: pathlib.Path) -> dict[int, pathlib.Path]:
    """The rank folders of a job that hold a run (meta.json written), by rank: real folders
    inside the job folder only (a symlink named ``rank1`` is not followed)."""
    found: dict[int, pathlib.Path] = {}
    folder = RunFolder(job)
    try:
        names = folder.listdir()
    except RunDirError:
        return found
    for name in names:
        match = _RANK_DIR.match(name)
        if match and folder.is_dir([name]) and folder.is_file([name, META]):
            found[int(match.group(1))] = job / name
    return dict(sorted(found.items()))


__all__ = [
    "LAYOUT",
    "SUMMARY",
    "claim_rank_dir",
    "is_job",
    "job_meta",
    "job_stem",
    "rank_dir_name",
    "rank_dirs",
    "read_json",
    "write_job_meta",
]
