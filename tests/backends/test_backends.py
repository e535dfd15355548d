"""Backends and select(): CUDA logic runs against a fake pynvml and a faked torch.cuda."""

from __future__ import annotations

import importlib
import math
import os
import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from tests.backends.fake_allocator import memory_stats

import nbmonitor.backends as backends
import nbmonitor.backends.selection as backend_select
from fake_pynvml import FakeGpu, FakeNvml, NVMLError_GpuIsLost, NVMLError_Unknown
from nbmonitor.backends import (
    Backend,
    CpuBackend,
    CudaBackend,
    MpsBackend,
    decode_throttle,
    select,
)
from nbmonitor.backends.cpu import CPU_KEYS
from nbmonitor.backends.cuda import ALLOCATOR_KEYS, GPU_FIELDS, PCIE_FIELDS, THROTTLE_REASONS

PID = os.getpid()


def uuid(k: int) -> str:
    return f"GPU-{k:08d}-1111-2222-3333-444444444444"


class FakeCuda:
    """torch.cuda as seen by a process, including CUDA_VISIBLE_DEVICES remapping."""

    def __init__(self, physical: list[FakeGpu], *, with_uuid: bool = True) -> None:
        self.physical = physical
        self.with_uuid = with_uuid
        self.stats = memory_stats(
            {
                "allocated_bytes.all.current": 3_000,
                "reserved_bytes.all.current": 8_000,
                "allocated_bytes.all.peak": 5_000,
                "num_alloc_retries": 2,
                "num_ooms": 0,
            }
        )
        self.resets = 0

    def visible(self) -> list[FakeGpu]:
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is None:
            return list(self.physical)
        out = []
        for entry in env.split(","):
            if entry.isdigit():
                out.append(self.physical[int(entry)])
            else:
                out.append(next(g for g in self.physical if g.uuid.startswith(entry)))
        return out

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def properties(i: int) -> Any:
            gpu = self.visible()[i]
            props = types.SimpleNamespace(name=gpu.name, total_memory=gpu.mem_total)
            if self.with_uuid:
                props.uuid = gpu.uuid.removeprefix("GPU-")  # torch prints the bare form
            return props

        def reset(device: int) -> None:
            self.resets += 1

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: len(self.visible()))
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: properties(i).name)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda device: dict(self.stats))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid(k), util=10 * (k + 1), processes=[(PID, 1_234), (PID + 1, 999)])
        for k in range(3)
    ]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> FakeNvml:
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> FakeCuda:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeCuda(gpus)
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def make_backend(nvml: FakeNvml, cuda: FakeCuda) -> Iterator[Callable[..., CudaBackend]]:
    made: list[CudaBackend] = []

    def make(*args: Any, **kwargs: Any) -> CudaBackend:
        backend = CudaBackend(*args, **kwargs)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def nan(value: float) -> bool:
    return math.isnan(value)


# -- CUDA backend fields -------------------------------------------------------------------


def test_fields_are_read_and_converted(
    make_backend: Callable[..., CudaBackend], gpus: list[FakeGpu]
) -> None:
    gpus[0].clocks_event_reasons = 0x4
    backend = make_backend(0)
    first = backend.sample()
    assert set(first) == set(backend.keys)
    assert backend.keys[: len(CPU_KEYS)] == CPU_KEYS
    assert first["gpu0_util_percent"] == 10.0
    assert first["gpu0_mem_util_percent"] == 40.0
    assert first["gpu0_mem_used_bytes"] == 30 * 2**30
    assert first["gpu0_mem_total_bytes"] == 80 * 2**30
    assert first["gpu0_temperature_c"] == 61.0
    assert first["gpu0_power_w"] == pytest.approx(350.0)  # from mW
    assert first["gpu0_power_limit_w"] == pytest.approx(700.0)
    assert first["gpu0_energy_j"] == 0.0  # relative to the first reading
    assert first["gpu0_sm_clock_mhz"] == 1980.0
    assert first["gpu0_mem_clock_mhz"] == 2619.0
    assert first["gpu0_fan_percent"] == 45.0
    assert first["gpu0_throttle_mask"] == 4.0
    assert first["gpu0_process_mem_bytes"] == 1_234.0  # only this PID's entry
    assert first["gpu2_util_percent"] == 30.0
    assert first["cuda_allocated_bytes"] == 3_000.0
    assert first["cuda_reserved_bytes"] == 8_000.0
    assert first["cuda_peak_allocated_bytes"] == 5_000.0
    assert first["cuda_alloc_retries"] == 2.0
    assert first["cuda_ooms"] == 0.0
    assert first["cuda_total_bytes"] == 80 * 2**30  # torch's total_memory of the device
    # NVML's 1,234 bytes for this process are less than what the fake allocator reserved.
    assert first["cuda_non_pytorch_bytes"] == 0.0
    assert all(not math.isnan(first[k]) for k in first if k.startswith("gpu"))

    gpus[0].energy_mj += 2_500  # 2.5 J later
    gpus[0].power_mw = 123_456
    second = backend.sample()
    assert second["gpu0_energy_j"] == pytest.approx(2.5)
    assert second["gpu0_power_w"] == pytest.approx(123.456)
    assert backend.notes == []


def test_keys_cover_every_gpu_and_field(make_backend: Callable[..., CudaBackend]) -> None:
    backend = make_backend(0)
    expected = {f"gpu{i}_{f}" for i in range(3) for f in GPU_FIELDS}
    assert expected | set(CPU_KEYS) | set(ALLOCATOR_KEYS) == set(backend.keys)
    assert len(backend.keys) == len(set(backend.keys))
    assert isinstance(backend, Backend)


def test_process_memory_is_nan_when_this_pid_is_not_listed(
    make_backend: Callable[..., CudaBackend], gpus: list[FakeGpu]
) -> None:
    gpus[0].processes = [(PID + 1, 999)]  # e.g. a container that sees host PIDs
    gpus[1].processes = [(PID, None)]  # Windows WDDM: usage not reported
    out = make_backend(0).sample()
    assert nan(out["gpu0_process_mem_bytes"])
    assert nan(out["gpu1_process_mem_bytes"])
    assert out["gpu2_process_mem_bytes"] == 1_234.0


def test_nvml_is_initialised_lazily_once_and_shut_down(nvml: FakeNvml, cuda: FakeCuda) -> None:
    importlib.reload(backends)  # importing the package must not touch NVML
    backend = CudaBackend(0)
    assert backend.devices == ("NVIDIA H100 80GB HBM3",) * 3
    assert nvml.calls["nvmlInit"] == 0
    assert sum(nvml.calls.values()) == 0  # construction asked NVML nothing
    backend.sample()
    backend.sample()
    backend.sample()
    assert nvml.calls["nvmlInit"] == 1
    assert nvml.initialised == 1
    backend.close()
    backend.close()  # idempotent
    assert nvml.calls["nvmlShutdown"] == 1
    assert nvml.initialised == 0
    after = backend.sample()  # a late tick after close reads no NVML and does not re-init
    assert nvml.calls["nvmlInit"] == 1
    assert nan(after["gpu0_util_percent"])


def test_not_supported_field_is_nan_and_never_asked_again(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    for gpu in gpus:
        gpu.unsupported = {"nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEnergyConsumption"}
    gpus[0].unsupported.add("nvmlDeviceGetPowerUsage")
    backend = make_backend(0)
    for _ in range(4):
        out = backend.sample()
    assert nan(out["gpu0_fan_percent"]) and nan(out["gpu2_fan_percent"])
    assert nan(out["gpu0_energy_j"])
    assert nan(out["gpu0_power_w"])
    assert out["gpu1_power_w"] == pytest.approx(350.0)  # per GPU, not global
    assert nvml.calls["nvmlDeviceGetFanSpeed"] == 3  # once per GPU, then never again
    assert nvml.calls["nvmlDeviceGetTotalEnergyConsumption"] == 3
    assert nvml.calls["nvmlDeviceGetPowerUsage"] == 1 + 4 + 4
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 12
    assert backend.notes == []  # unsupported is not an error


@pytest.mark.parametrize("error", [NVMLError_GpuIsLost, NVMLError_Unknown])
def test_gpu_that_disappears_gives_nan_and_a_note(
    make_backend: Callable[..., CudaBackend],
    nvml: FakeNvml,
    gpus: list[FakeGpu],
    error: type[Exception],
) -> None:
    backend = make_backend(0)
    assert backend.sample()["gpu1_util_percent"] == 20.0
    gpus[1].fail_with = error
    calls_before = sum(nvml.calls.values())
    out = backend.sample()
    assert all(nan(out[f"gpu1_{f}"]) for f in GPU_FIELDS)
    assert out["gpu0_util_percent"] == 10.0 and out["gpu2_util_percent"] == 30.0
    assert set(out) == set(backend.keys)
    lost_notes = [n for n in backend.notes if n.startswith("gpu1") and "lost" in n]
    assert len(lost_notes) == 1
    per_tick = sum(nvml.calls.values()) - calls_before
    calls_before = sum(nvml.calls.values())
    backend.sample()
    assert sum(nvml.calls.values()) - calls_before < per_tick  # gpu1 is no longer asked
    assert len([n for n in backend.notes if n.startswith("gpu1")]) == 1


def test_nvml_init_failure_keeps_allocator_stats(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml
) -> None:
    from fake_pynvml import NVMLError_LibraryNotFound

    nvml.init_error = NVMLError_LibraryNotFound
    backend = make_backend(0)
    out = backend.sample()
    backend.sample()
    assert set(out) == set(backend.keys)
    assert all(nan(v) for k, v in out.items() if k.startswith("gpu"))
    assert out["cuda_allocated_bytes"] == 3_000.0
    assert nvml.calls["nvmlInit"] == 1  # not retried every tick
    assert any("nvmlInit failed" in n for n in backend.notes)


# -- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------


@pytest.mark.parametrize("with_uuid", [True, False], ids=["torch-uuid", "env-parsing"])
@pytest.mark.parametrize(
    "env",
    [
        "2,0",
        f"{uuid(2)},{uuid(0)}",
        f"{uuid(2)[:12]},{uuid(0)[:12]}",  # CUDA accepts unambiguous prefixes
    ],
    ids=["indices", "uuids", "uuid-prefixes"],
)
def test_visible_devices_are_mapped_to_nvml_devices(
    monkeypatch: pytest.MonkeyPatch,
    nvml: FakeNvml,
    gpus: list[FakeGpu],
    env: str,
    with_uuid: bool,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    FakeCuda(gpus, with_uuid=with_uuid).install(monkeypatch)
    backend = CudaBackend(0)
    try:
        out = backend.sample()
    finally:
        backend.close()
    assert backend.gpu_count == 2
    assert out["gpu0_util_percent"] == gpus[2].util  # torch 0 is physical 2
    assert out["gpu1_util_percent"] == gpus[0].util
    assert "gpu2_util_percent" not in out
    if with_uuid:
        assert nvml.calls["nvmlDeviceGetHandleByUUID"] == 2
        assert nvml.calls["nvmlDeviceGetHandleByIndex"] == 0


def test_unset_visible_devices_maps_one_to_one(
    make_backend: Callable[..., CudaBackend], gpus: list[FakeGpu]
) -> None:
    out = make_backend(0).sample()
    assert [out[f"gpu{i}_util_percent"] for i in range(3)] == [g.util for g in gpus]


def test_unmatched_device_is_nan_with_a_note(
    make_backend: Callable[..., CudaBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = torch.cuda.get_device_properties

    def properties(i: int) -> Any:
        props = real(i)
        if i == 1:
            props.uuid = "deadbeef-0000-0000-0000-000000000000"  # no NVML device has it
        return props

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    backend = make_backend(0)
    out = backend.sample()
    assert all(nan(out[f"gpu1_{f}"]) for f in GPU_FIELDS)
    assert out["gpu0_util_percent"] == 10.0 and out["gpu2_util_percent"] == 30.0
    assert any(n.startswith("gpu1: no NVML device matches") for n in backend.notes)


# -- API choices ---------------------------------------------------------------------------


def test_pcie_is_off_by_default_and_opt_in(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml
) -> None:
    plain = make_backend(0)
    plain.sample()
    assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert not any("pcie" in k for k in plain.keys)
    with_pcie = make_backend(0, pcie=True)
    out = with_pcie.sample()
    assert {f"gpu0_{f}" for f in PCIE_FIELDS} <= set(with_pcie.keys)
    assert out["gpu0_pcie_tx_bytes_per_s"] == 1000 * 1024  # from KB/s
    assert out["gpu0_pcie_rx_bytes_per_s"] == 2000 * 1024


def test_current_apis_are_preferred_over_deprecated(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml
) -> None:
    make_backend(0).sample()
    assert nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 3
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 0
    assert nvml.calls["nvmlDeviceGetTemperatureV"] == 3
    assert nvml.calls["nvmlDeviceGetTemperature"] == 0


def test_older_pynvml_falls_back_to_deprecated_calls(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml, gpus: list[FakeGpu]
) -> None:
    nvml.remove("nvmlDeviceGetCurrentClocksEventReasons")
    nvml.remove("nvmlDeviceGetTemperatureV")
    gpus[0].clocks_event_reasons = 0x40
    out = make_backend(0).sample()
    assert out["gpu0_throttle_mask"] == 0x40
    assert out["gpu0_temperature_c"] == 61.0
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_memory_v2_missing_in_driver_falls_back_to_v1(
    make_backend: Callable[..., CudaBackend], nvml: FakeNvml
) -> None:
    from fake_pynvml import NVML_ERROR_FUNCTION_NOT_FOUND, NVMLError

    original = nvml.nvmlDeviceGetMemoryInfo
    versions: Counter[int | None] = Counter()

    def old_driver(handle: FakeGpu, version: int | None = None) -> Any:
        versions[version] += 1
        if version:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return original(handle)

    nvml.nvmlDeviceGetMemoryInfo = old_driver
    backend = make_backend(0)
    backend.sample()
    out = backend.sample()
    assert out["gpu0_mem_total_bytes"] == 80 * 2**30
    assert versions[nvml.nvmlMemory_v2] == 3  # tried once per GPU, then v1 only
    assert versions[None] == 6
    assert backend.notes == []


def test_peak_memory_counter_is_never_reset(
    make_backend: Callable[..., CudaBackend], cuda: FakeCuda
) -> None:
    # The counter is process-wide: the user's max_memory_allocated() must keep its meaning.
    backend = make_backend(0)
    for _ in range(3):
        backend.sample()
    assert cuda.resets == 0
    with pytest.raises(TypeError):
        make_backend(0, reset_peak=True)  # no way to ask for it any more


def test_allocator_failure_is_nan_with_one_note(
    make_backend: Callable[..., CudaBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: int) -> dict[str, int]:
        raise RuntimeError("CUDA driver error")

    monkeypatch.setattr(torch.cuda, "memory_stats", broken)
    backend = make_backend(0)
    backend.sample()
    out = backend.sample()
    assert all(nan(out[k]) for k in ALLOCATOR_KEYS)
    assert out["gpu0_util_percent"] == 10.0
    assert len([n for n in backend.notes if "memory_stats" in n]) == 1


def test_field_latency_is_recorded(make_backend: Callable[..., CudaBackend]) -> None:
    backend = make_backend(0)
    assert backend.field_latency_us() == {}
    backend.sample()
    latency = backend.field_latency_us()
    assert {"nvml_init", "utilization", "memory", "temperature", "power"} <= set(latency)
    assert all(v > 0 for v in latency.values())


def test_device_gauges(make_backend: Callable[..., CudaBackend], gpus: list[FakeGpu]) -> None:
    gpus[1].clocks_event_reasons = 0x4 | 0x40
    backend = make_backend(0)
    gauges = backend.device_gauges(backend.sample())
    assert len(gauges) == 3
    assert gauges[1]["name"] == "NVIDIA H100 80GB HBM3"
    assert gauges[1]["util_percent"] == 20.0
    assert gauges[1]["power_limit_w"] == pytest.approx(700.0)
    assert gauges[1]["throttle"] == "sw_power_cap, hw_thermal_slowdown"
    assert gauges[0]["throttle"] == ""
    assert CpuBackend().device_gauges({}) == []


def test_decode_throttle() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x1) == ["gpu_idle"]
    assert decode_throttle(0x4 | 0x20 | 0x80) == [
        "sw_power_cap",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    ]
    assert decode_throttle(0x1FF) == [name for _, name in THROTTLE_REASONS]
    assert decode_throttle(0x8 | 0x400) == ["hw_slowdown", "0x400"]


def test_throttle_bits_match_nvidia_ml_py() -> None:
    real = pytest.importorskip("pynvml")
    if not hasattr(real, "nvmlClocksEventReasonGpuIdle"):
        pytest.skip("nvidia-ml-py too old to name clock-event reasons")
    for bit, name in THROTTLE_REASONS:
        camel = "".join(part.capitalize() for part in name.split("_"))
        assert getattr(real, f"nvmlClocksEventReason{camel}") == bit, name


# -- select() ------------------------------------------------------------------------------


def test_select_cpu_and_auto_on_a_cpu_model() -> None:
    model = torch.nn.Linear(2, 2)
    assert isinstance(select(model), CpuBackend)
    assert isinstance(select(model, "cpu"), CpuBackend)
    assert isinstance(select(torch.nn.ReLU()), CpuBackend)  # no parameters at all


def test_select_unknown_name() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'; use one of auto, cpu, mps"):
        select(torch.nn.Linear(2, 2), "tpu")


def test_select_forced_cuda_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError) as info:
        select(torch.nn.Linear(2, 2), "cuda")
    assert str(info.value) == (
        "nbmonitor: backend='cuda' but torch.cuda.is_available() is False; "
        "use backend='auto' or 'cpu'."
    )


def test_select_forced_mps_without_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"backend='mps' but .*use backend='auto' or 'cpu'"):
        select(torch.nn.Linear(2, 2), "mps")


def test_select_auto_on_a_cuda_model(
    monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml, cuda: FakeCuda
) -> None:
    monkeypatch.setattr(backend_select, "model_device", lambda model: torch.device("cuda", 1))
    backend = select(torch.nn.Linear(2, 2))
    try:
        assert isinstance(backend, CudaBackend)
        assert backend.device_index == 1
        assert nvml.calls["nvmlInit"] == 0  # select() leaves init to the sampler thread
        assert backend.sample()["gpu1_util_percent"] == 20.0
    finally:
        backend.close()


def test_select_forced_cuda_for_a_cpu_model_notes_it(nvml: FakeNvml, cuda: FakeCuda) -> None:
    backend = select(torch.nn.Linear(2, 2), "cuda")
    try:
        assert isinstance(backend, CudaBackend)
        assert backend.device_index == 0
        assert any("model is on cpu" in n for n in backend.notes)
    finally:
        backend.close()


def test_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch, cuda: FakeCuda) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    model = torch.nn.Linear(2, 2)
    assert isinstance(select(model), CpuBackend)
    monkeypatch.setattr(backend_select, "model_device", lambda model: torch.device("cuda", 0))
    backend = select(model)
    try:
        assert isinstance(backend, CudaBackend)  # not CPU: allocator stats still matter
        out = backend.sample()
        assert set(out) == set(backend.keys)
        assert all(nan(v) for k, v in out.items() if k.startswith("gpu"))
        assert out["cuda_reserved_bytes"] == 8_000.0
        assert any("nbmonitor[cuda]" in n for n in backend.notes)
    finally:
        backend.close()


def test_select_auto_on_an_mps_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_select, "model_device", lambda model: torch.device("mps"))
    assert isinstance(select(torch.nn.Linear(2, 2)), MpsBackend)


# -- MPS -----------------------------------------------------------------------------------


def test_mps_backend_reads_torch_mps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.mps, "current_allocated_memory", lambda: 1_000)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 4_000)
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16_000)
    backend = MpsBackend()
    out = backend.sample()
    assert isinstance(backend, Backend)
    assert set(out) == set(backend.keys)
    assert out["mps_allocated_bytes"] == 1_000.0
    assert out["mps_driver_allocated_bytes"] == 4_000.0
    assert out["mps_recommended_max_bytes"] == 16_000.0
    assert out["ram_total_bytes"] > 0
    [gauge] = backend.device_gauges(out)
    assert gauge["mem_used_bytes"] == 1_000.0 and gauge["mem_total_bytes"] == 16_000.0


def test_mps_backend_missing_or_failing_calls_are_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> int:
        raise RuntimeError("MPS backend is not available")

    monkeypatch.setattr(torch.mps, "current_allocated_memory", fails)
    monkeypatch.delattr(torch.mps, "recommended_max_memory")
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: 4_000)
    out = MpsBackend().sample()
    assert nan(out["mps_allocated_bytes"])
    assert nan(out["mps_recommended_max_bytes"])
    assert out["mps_driver_allocated_bytes"] == 4_000.0


def test_mps_names_its_chip_for_the_mfu_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from nbmonitor.backends import mps

    monkeypatch.setattr(mps.sys, "platform", "darwin")

    def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert args == ["sysctl", "-n", "machdep.cpu.brand_string"]
        return subprocess.CompletedProcess(args, 0, stdout="Apple M2 Pro\n")

    monkeypatch.setattr(mps.subprocess, "run", run)
    assert MpsBackend().devices == ("Apple M2 Pro GPU (MPS)",)

    def fails(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError("sysctl")

    monkeypatch.setattr(mps.subprocess, "run", fails)
    assert MpsBackend().devices == ("Apple GPU (MPS)",)
    monkeypatch.setattr(mps.sys, "platform", "linux")
    assert mps.chip_name() == "Apple"
