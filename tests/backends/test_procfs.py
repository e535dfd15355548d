"""The CPU backend's /proc counters: psutil's figures, without an open() per reading."""

from __future__ import annotations

import math
import os
import sys
import time

import psutil
import pytest

from nbmonitor.backends import CpuBackend, _procfs
from nbmonitor.backends._procfs import ProcCounters

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def spin_cpu(seconds: float) -> None:
    """Busy until this process has used ``seconds`` of CPU, however long that takes."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def process_seconds() -> float:
    t = os.times()  # the clock ProcCounters reads: the same granularity
    return t.user + t.system


@linux
def test_readings_agree_with_psutil() -> None:
    # Bracketed by the process's CPU time and the wall clock read just before and after each of
    # the counters' own readings: whatever share of a CPU a loaded machine leaves this process,
    # its percentage lies between these bounds (in percent of one CPU, not of the machine).
    cpu_before, wall_before = process_seconds(), time.monotonic()
    counters = ProcCounters()
    cpu_after, wall_after = process_seconds(), time.monotonic()
    process = psutil.Process()
    process.cpu_percent(None)
    psutil.cpu_percent(None)
    spin_cpu(0.3)  # CPU time, not wall time: a measurable reading even on a busy machine
    ours_system, theirs_system = counters.cpu_percent(), psutil.cpu_percent(None)
    cpu_a, wall_a = process_seconds(), time.monotonic()
    ours_process = counters.process_cpu_percent()
    cpu_b, wall_b = process_seconds(), time.monotonic()
    theirs_process = process.cpu_percent(None)
    low = (cpu_a - cpu_after) / (wall_b - wall_before) * 100.0
    high = (cpu_b - cpu_before) / (wall_a - wall_after) * 100.0
    assert low <= ours_process <= high
    assert ours_process > 0.0
    assert ours_system == pytest.approx(theirs_system, abs=5.0)
    assert ours_process == pytest.approx(theirs_process, abs=10.0)
    assert counters.rss_bytes() == pytest.approx(process.memory_info().rss, rel=0.05)
    total, available = counters.memory()
    vm = psutil.virtual_memory()
    assert total == vm.total
    assert available == pytest.approx(vm.available, rel=0.05)
    counters.close()


@linux
def test_descriptors_are_held_then_closed_once() -> None:
    before = open_fds()
    backend = CpuBackend()
    assert open_fds() == before + 3
    opened = list(os.listdir("/proc/self/fd"))
    for _ in range(3):
        sample = backend.sample()
        assert sample["process_rss_bytes"] > 0 and sample["ram_total_bytes"] > 0
    assert sorted(os.listdir("/proc/self/fd")) == sorted(opened)  # nothing opened per sample
    backend.close()
    backend.close()
    assert open_fds() == before


@linux
def test_a_dropped_backend_gives_its_descriptors_back() -> None:
    before = open_fds()
    for _ in range(20):
        CpuBackend()
    import gc

    gc.collect()
    assert open_fds() == before


@linux
def test_no_time_passed_reads_nan_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    counters = ProcCounters()
    monkeypatch.setattr(counters, "_cpu_times", lambda: (counters._busy, counters._total))
    monkeypatch.setattr(_procfs, "_process_seconds", lambda: counters._proc)
    monkeypatch.setattr(_procfs.time, "monotonic", lambda: counters._wall)
    assert math.isnan(counters.cpu_percent())
    assert math.isnan(counters.process_cpu_percent())
    counters.close()


def test_without_proc_psutil_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: str, *args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(_procfs.os, "open", refuse)
    backend = CpuBackend()
    assert backend.source == "psutil"
    sample = backend.sample()
    assert sample["process_rss_bytes"] > 0
    assert sample["ram_total_bytes"] == psutil.virtual_memory().total
    assert 0.0 <= sample["ram_percent"] <= 100.0
    backend.close()


@linux
def test_a_kernel_without_memavailable_falls_back_to_psutil(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = open_fds()
    monkeypatch.setattr(ProcCounters, "memory", lambda self: (1.0, math.nan))
    backend = CpuBackend()
    assert backend.source == "psutil"
    assert open_fds() == before  # what it had opened is closed again
    assert backend.sample()["ram_total_bytes"] == psutil.virtual_memory().total


def test_a_late_sample_after_close_reads_nothing() -> None:
    backend = CpuBackend()
    backend.close()
    assert all(math.isnan(v) for v in backend.sample().values())


@linux
def test_proc_that_cannot_be_read_switches_to_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    before = open_fds()
    backend = CpuBackend()
    assert backend.source == "/proc" and open_fds() > before

    def unreadable(self: ProcCounters) -> float:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ProcCounters, "rss_bytes", unreadable)
    first = backend.sample()  # the sampler's source must not fail: psutil takes over
    assert backend.source == "psutil" and open_fds() == before  # its descriptors closed
    assert math.isnan(first["cpu_percent"]) and math.isnan(first["process_cpu_percent"])
    assert first["process_rss_bytes"] > 0 and first["ram_total_bytes"] > 0
    spin_cpu(0.2)  # some CPU time to read, however busy the machine
    second = backend.sample()
    assert 0.0 <= second["cpu_percent"] <= 100.0
    assert second["process_cpu_percent"] > 0.0
    backend.close()


def test_not_linux_uses_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_procfs.sys, "platform", "win32")
    with pytest.raises(OSError, match="no Linux /proc"):
        ProcCounters()
    backend = CpuBackend()
    assert backend.source == "psutil"
    assert backend.sample()["process_rss_bytes"] > 0
    backend.close()


@linux
def test_proc_that_does_not_parse_is_refused_with_nothing_left_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def garbled(self: ProcCounters) -> tuple[float, float]:
        raise ValueError("could not convert string to float: b'cpu?'")

    monkeypatch.setattr(ProcCounters, "_cpu_times", garbled)
    before = open_fds()
    with pytest.raises(OSError, match="does not read as expected"):
        ProcCounters()
    assert open_fds() == before
    backend = CpuBackend()
    assert backend.source == "psutil" and open_fds() == before
    assert backend.sample()["ram_total_bytes"] > 0
