"""CPU and memory counters of this process and of the machine, from Linux's ``/proc``, read
through descriptors held open for the whole run.

psutil opens, reads and closes a ``/proc`` file for each reading; an ``open()`` under ``/proc``
costs far more than a ``pread()`` on a descriptor already open once the sampler thread has slept
for a tick, and the sampler reads four of them every tick (the figures: benchmarks/NOTES.md,
"What the overhead is made of"). The fields read are those psutil reads, and
the arithmetic is psutil's, so both give the same figures; elsewhere than Linux psutil is used as it
is.
"""

from __future__ import annotations

import math
import os
import sys
import time
import weakref

# The first line of /proc/stat (the machine's total) and the first lines of /proc/meminfo
# are all that is read: a pread() of this many bytes returns them, however many CPUs there are.
_HEAD_BYTES = 512


class ProcCounters:
    """Held descriptors on ``/proc/stat``, ``/proc/self/statm`` and ``/proc/meminfo``.

    Raises OSError where they cannot be opened or do not read as Linux's do (not Linux, a
    sandbox, a kernel without MemAvailable), having closed whatever it had opened. Percentages
    are over the time since the previous call (the first call: since construction).
    """

    def __init__(self) -> None:
        self._fds: list[int] = []
        if not sys.platform.startswith("linux"):
            # Elsewhere /proc is absent or another format, and os.pread may not exist.
            raise OSError(f"no Linux /proc on {sys.platform}")
        try:
            for path in ("/proc/stat", "/proc/self/statm", "/proc/meminfo"):
                self._fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            self.close()
            raise
        self._stat, self._statm, self._meminfo = self._fds
        # A backend dropped without close() (one made and discarded) still gives them back.
        self._closer = weakref.finalize(self, _close_all, list(self._fds))
        try:
            self._page = os.sysconf("SC_PAGE_SIZE")
            self._busy, self._total = self._cpu_times()
            self.rss_bytes()
            if not math.isfinite(self.memory()[1]):
                raise OSError("/proc/meminfo has no MemAvailable (Linux older than 3.14)")
        except (OSError, ValueError, IndexError) as exc:
            self.close()
            raise OSError(f"/proc does not read as expected: {exc}") from exc
        self._proc = _process_seconds()
        self._wall = time.monotonic()

    def _cpu_times(self) -> tuple[float, float]:
        line = os.pread(self._stat, _HEAD_BYTES, 0).split(b"\n", 1)[0]
        fields = [float(v) for v in line.split()[1:]]
        # As psutil: guest time is already counted in user and nice, and idle + iowait is
        # the time not busy.
        guest = sum(fields[8:10])
        total = sum(fields) - guest
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
        return total - idle, total

    def cpu_percent(self) -> float:
        """The machine's CPU use, in percent of all its CPUs (NaN when no time has passed)."""
        busy, total = self._cpu_times()
        d_busy, d_total = busy - self._busy, total - self._total
        self._busy, self._total = busy, total
        if d_total <= 0:
            return math.nan
        return min(max(d_busy / d_total * 100.0, 0.0), 100.0)

    def process_cpu_percent(self) -> float:
        """This process's CPU use, in percent of one CPU (above 100 with several threads)."""
        proc, wall = _process_seconds(), time.monotonic()
        d_proc, d_wall = proc - self._proc, wall - self._wall
        self._proc, self._wall = proc, wall
        return d_proc / d_wall * 100.0 if d_wall > 0 else math.nan

    def rss_bytes(self) -> float:
        """This process's resident set size."""
        return float(int(os.pread(self._statm, _HEAD_BYTES, 0).split()[1]) * self._page)

    def memory(self) -> tuple[float, float]:
        """The machine's total and available memory in bytes (NaN for one not listed)."""
        total = available = math.nan
        for line in os.pread(self._meminfo, _HEAD_BYTES, 0).split(b"\n"):
            if line.startswith(b"MemTotal:"):
                total = float(line.split()[1]) * 1024
            elif line.startswith(b"MemAvailable:"):
                available = float(line.split()[1]) * 1024
                break
        return total, available

    def close(self) -> None:
        """Close the descriptors; idempotent."""
        closer = getattr(self, "_closer", None)
        if closer is not None:
            closer()
        else:  # construction failed half-way
            _close_all(self._fds)
        self._fds = []


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _process_seconds() -> float:
    # times() is one system call, no file: user + system time of every thread of the process.
    t = os.times()
    return t.user + t.system
