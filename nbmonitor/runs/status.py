"""Whether a run is still being written: from meta.json, the writer's pid, and the last write.

``closed`` / ``degraded`` / ``stopped`` (a stop asked for: ``mon.stop()``, the dashboard,
``nbmonitor ctl``) come from meta.json (written at close). A run without them is either
running or its writer died without closing (SIGKILL, OOM, a lost node). On the writer's own
host the pid tells: alive (and started no later than the run) is ``running``, gone is
``killed``. From another host (a cluster job on a shared filesystem) only the files tell: a
write within :data:`STALE_S` is ``running``, otherwise ``unknown``.
"""

from __future__ import annotations

import os
import pathlib
import socket
import time
from collections.abc import Iterable, Mapping

# The sampler writes system samples every interval (0.5 s by default), so a live run touches
# its files far more often than this.
STALE_S = 120.0

STATUSES = ("running", "closed", "degraded", "stopped", "killed", "unknown")
# The statuses meta.json holds once its run closed.
CLOSED_STATUSES = ("closed", "degraded", "stopped")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def _started_after(pid: int, timestamp: float) -> bool:
    """True if process ``pid`` started after ``timestamp`` (its pid was reused); Linux only."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            float(ln.split()[1])
            for ln in pathlib.Path("/proc/stat").read_text().splitlines()
            if ln.startswith("btime ")
        )
        ticks = float(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        return boot + ticks / os.sysconf("SC_CLK_TCK") > timestamp + 1.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False


def run_status(meta: Mapping[str, object], files: Iterable[pathlib.Path]) -> str:
    """One of :data:`STATUSES` for a run with this meta.json and these record files."""
    status = meta.get("status")
    if status in CLOSED_STATUSES:
        return str(status)
    if meta.get("end_time"):
        return "closed"
    pid, host = meta.get("pid"), meta.get("host")
    # A pid from a file is untrusted: a bool, or past what a pid can be, is no pid at all.
    if type(pid) is int and 0 < pid < 2**31 and host == socket.gethostname():
        if not _pid_alive(pid):
            return "killed"
        started = meta.get("start_timestamp")
        if isinstance(started, (int, float)) and _started_after(pid, float(started)):
            return "killed"
        return "running"
    newest = 0.0
    for path in files:
        try:
            newest = max(newest, path.stat().st_mtime)
        except OSError:
            continue
    return "running" if time.time() - newest < STALE_S else "unknown"
