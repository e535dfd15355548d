"""The machine backend (nbmonitor.devices(), nbmonitor top) against fake NVML devices."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fake_pynvml import FakeGpu, FakeNvml, NVMLError_GpuIsLost
from nbmonitor.backends.machine import IO_KEYS, MachineBackend

ME = os.getpid()


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(f"GPU-{k:08d}-0000-0000-0000-000000000000", util=20 * k, temperature=50 + k)
        for k in range(3)
    ]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> FakeNvml:
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def backend(nvml: FakeNvml) -> Iterator[MachineBackend]:
    made = MachineBackend()
    yield made
    made.close()


def test_every_nvml_device_with_every_field(backend: MachineBackend, gpus: list[FakeGpu]) -> None:
    gpus[2].clocks_event_reasons = 0x040
    gpus[1].pcie_link = (3, 8)
    out = backend.sample()
    assert set(out) == set(backend.keys)
    assert backend.name == "cuda"
    assert backend.devices == ("NVIDIA H100 80GB HBM3",) * 3
    assert [out[f"gpu{i}_util_percent"] for i in range(3)] == [0.0, 20.0, 40.0]
    assert out["gpu1_temperature_c"] == 51.0
    assert out["gpu0_power_w"] == pytest.approx(350.0)
    assert out["gpu0_sm_clock_mhz"] == 1980.0
    assert (out["gpu1_pcie_gen"], out["gpu1_pcie_width"]) == (3.0, 8.0)
    assert math.isfinite(out["ram_total_bytes"]) and out["ram_total_bytes"] > 0
    gauges = backend.device_gauges(out)
    assert [g["index"] for g in gauges] == [0.0, 1.0, 2.0]
    assert gauges[2]["throttle"] == "hw_thermal_slowdown"
    assert gauges[0]["throttle"] == ""
    assert gauges[0]["nvlink_links"] == 0.0


def test_io_rates_need_two_readings(backend: MachineBackend) -> None:
    first = backend.sample()
    assert all(math.isnan(first[k]) for k in IO_KEYS)
    with open(os.devnull, "wb") as sink:  # some traffic is not needed: a rate of 0 is a rate
        sink.write(b"x")
    second = backend.sample()
    rates = [second[k] for k in ("disk_read_bytes_per_s", "net_recv_bytes_per_s")]
    assert all(math.isfinite(r) and r >= 0 for r in rates), second


def test_processes_per_gpu_with_names(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        gpus[0].processes = [(ME, 2 * 2**30), (child.pid, 5 * 2**30), (999_999_999, None)]
        gpus[1].processes = [(child.pid, 2**30)]
        backend = MachineBackend()
        try:
            out = backend.sample()
            procs = backend.processes()
        finally:
            backend.close()
    finally:
        child.kill()
        child.wait()
    assert [p.pid for p in procs[0]] == [child.pid, ME, 999_999_999]  # largest first
    assert procs[0][0].name.startswith("python")
    assert procs[0][0].used_bytes == 5 * 2**30
    assert procs[0][2].name == "?" and math.isnan(procs[0][2].used_bytes)
    assert [p.pid for p in procs[1]] == [child.pid]
    assert procs[2] == ()
    # This process's own memory on each GPU, as a run's process_mem_bytes.
    assert out["gpu0_process_mem_bytes"] == 2 * 2**30
    assert math.isnan(out["gpu1_process_mem_bytes"])


def test_nvlink_links_are_counted_once(nvml: FakeNvml, gpus: list[FakeGpu]) -> None:
    gpus[1].nvlinks = 12
    backend = MachineBackend()
    try:
        calls = nvml.calls["nvmlDeviceGetNvLinkState"]
        backend.sample()
        backend.sample()
        assert nvml.calls["nvmlDeviceGetNvLinkState"] == calls
        assert backend.nvlinks == [0, 12, 0]
    finally:
        backend.close()


def test_pcie_throughput_only_when_asked(nvml: FakeNvml) -> None:
    backend = MachineBackend()
    backend.sample()
    backend.close()
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
    backend = MachineBackend(pcie=True)
    try:
        out = backend.sample()
    finally:
        backend.close()
    assert out["gpu0_pcie_tx_bytes_per_s"] == 1000 * 1024.0


def test_lost_gpu_is_nan_with_a_note(backend: MachineBackend, gpus: list[FakeGpu]) -> None:
    backend.sample()
    gpus[1].fail_with = NVMLError_GpuIsLost
    out = backend.sample()
    assert math.isnan(out["gpu1_util_percent"]) and out["gpu0_util_percent"] == 0.0
    assert any("gpu1: lost" in n for n in backend.notes)


def test_nvml_shut_down_once_at_close(nvml: FakeNvml) -> None:
    backend = MachineBackend()
    assert nvml.initialised == 1
    backend.close()
    backend.close()
    assert nvml.initialised == 0
    assert all(math.isnan(v) for v in backend.sample().values())


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    backend = MachineBackend()
    try:
        out = backend.sample()
    finally:
        backend.close()
    assert backend.devices == () and backend.name == "cpu"
    assert not any(k.startswith("gpu") for k in out)
    assert "nvidia-ml-py" in backend.notes[0]


def test_imports_no_torch() -> None:
    code = (
        "import sys; from nbmonitor.backends.machine import MachineBackend; "
        "b = MachineBackend(); b.sample(); b.close(); assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
