"""A stand-in for nvidia-ml-py's ``pynvml`` module, so CUDA backend logic runs without a GPU.

Field layouts, constant names and values, and the NVMLError class tree follow nvidia-ml-py 13
(``pynvml.py``). Install with ``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([...]))``.
Every call is counted in ``fake.calls`` (by function name) so tests can prove what was not
asked; ``fake.remove(name)`` deletes a function to mimic an older nvidia-ml-py.
"""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

# Error codes as in nvml.h / pynvml.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` builds the matching subclass."""

    _by_code: ClassVar[dict[int, type[NVMLError]]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


def _error_class(name: str, code: int) -> type[NVMLError]:
    cls = type(f"NVMLError_{name}", (NVMLError,), {})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _error_class("Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_NotSupported = _error_class("NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_LibraryNotFound = _error_class("LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_ArgumentVersionMismatch = _error_class(
    "ArgumentVersionMismatch", NVML_ERROR_ARGUMENT_VERSION_MISMATCH
)
NVMLError_Unknown = _error_class("Unknown", NVML_ERROR_UNKNOWN)

CONSTANTS: dict[str, int] = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_NVLINK_MAX_LINKS": 18,
    "nvmlMemory_v2": 0x02000028,
    "nvmlTemperature_v1": 0x0100000C,
    "nvmlClocksEventReasonGpuIdle": 0x001,
    "nvmlClocksEventReasonApplicationsClocksSetting": 0x002,
    "nvmlClocksEventReasonSwPowerCap": 0x004,
    "nvmlClocksEventReasonHwSlowdown": 0x008,
    "nvmlClocksEventReasonSyncBoost": 0x010,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x020,
    "nvmlClocksEventReasonHwThermalSlowdown": 0x040,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x080,
    "nvmlClocksEventReasonDisplayClockSetting": 0x100,
}


@dataclass
class FakeGpu:
    """One physical GPU, with values in NVML's own units (mW, mJ, bytes, KB/s)."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 87
    mem_util: int = 40
    mem_used: int = 30 * 2**30
    mem_total: int = 80 * 2**30
    temperature: int = 61
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    energy_mj: int = 5_000_000
    sm_clock: int = 1980
    mem_clock: int = 2619
    fan: int = 45
    clocks_event_reasons: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    pcie_kb_s: tuple[int, int] = (1000, 2000)  # (tx, rx)
    pcie_link: tuple[int, int] = (5, 16)  # (generation, width)
    nvlinks: int = 0  # NVLink links up; 0: no NVLink (the state call says NotSupported)
    # Functions that raise NotSupported on this GPU, and an error raised by every call.
    unsupported: set[str] = field(default_factory=set)
    fail_with: type[NVMLError] | None = None


@dataclass
class _Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass
class _Utilization:
    gpu: int
    memory: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int | None  # pynvml's field name


class FakeNvml(types.ModuleType):
    """The module object: physical GPUs in NVML (PCI bus) order."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.initialised = 0
        self.init_error: type[NVMLError] | None = None
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        for name, obj in globals().items():
            if name.startswith(("NVMLError", "NVML_ERROR_")):
                setattr(self, name, obj)
        for name in dir(type(self)):  # ModuleType's dir() lists only the module dict
            if name.startswith("_fn_"):
                setattr(self, name[4:], self._counted(name[4:], getattr(self, name)))

    def remove(self, name: str) -> None:
        delattr(self, name)

    def _counted(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name not in ("nvmlInit", "nvmlShutdown") and not self.initialised:
                raise NVMLError_Uninitialized(NVML_ERROR_UNINITIALIZED)
            if args and isinstance(args[0], FakeGpu):
                gpu = args[0]
                if gpu.fail_with is not None:
                    raise gpu.fail_with(0)
                if name in gpu.unsupported:
                    raise NVMLError_NotSupported(NVML_ERROR_NOT_SUPPORTED)
            return fn(*args, **kwargs)

        return call

    # Each _fn_X becomes the counted module function X (handles are the FakeGpu objects).
    def _fn_nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error(0)
        self.initialised += 1

    def _fn_nvmlShutdown(self) -> None:
        if not self.initialised:
            raise NVMLError_Uninitialized(NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def _fn_nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def _fn_nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self.gpus[index]

    def _fn_nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == text:
                return gpu
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def _fn_nvmlDeviceGetUUID(self, gpu: FakeGpu) -> str:
        return gpu.uuid

    def _fn_nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def _fn_nvmlDeviceGetUtilizationRates(self, gpu: FakeGpu) -> _Utilization:
        return _Utilization(gpu.util, gpu.mem_util)

    def _fn_nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu, version: int | None = None) -> _Memory:
        free = gpu.mem_total - gpu.mem_used
        if version:
            return _Memory(gpu.mem_total, free, gpu.mem_used, reserved=0, version=version)
        return _Memory(gpu.mem_total, free, gpu.mem_used)

    def _fn_nvmlDeviceGetTemperature(self, gpu: FakeGpu, sensor: int) -> int:
        return gpu.temperature

    def _fn_nvmlDeviceGetTemperatureV(self, gpu: FakeGpu, sensor: int) -> int:
        return gpu.temperature

    def _fn_nvmlDeviceGetPowerUsage(self, gpu: FakeGpu) -> int:
        return gpu.power_mw

    def _fn_nvmlDeviceGetEnforcedPowerLimit(self, gpu: FakeGpu) -> int:
        return gpu.power_limit_mw

    def _fn_nvmlDeviceGetTotalEnergyConsumption(self, gpu: FakeGpu) -> int:
        return gpu.energy_mj

    def _fn_nvmlDeviceGetClockInfo(self, gpu: FakeGpu, clock: int) -> int:
        return {1: gpu.sm_clock, 2: gpu.mem_clock}[clock]

    def _fn_nvmlDeviceGetFanSpeed(self, gpu: FakeGpu) -> int:
        return gpu.fan

    def _fn_nvmlDeviceGetCurrentClocksEventReasons(self, gpu: FakeGpu) -> int:
        return gpu.clocks_event_reasons

    def _fn_nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu: FakeGpu) -> int:
        return gpu.clocks_event_reasons

    def _fn_nvmlDeviceGetComputeRunningProcesses(self, gpu: FakeGpu) -> list[_Process]:
        return [_Process(pid, used) for pid, used in gpu.processes]

    def _fn_nvmlDeviceGetPcieThroughput(self, gpu: FakeGpu, counter: int) -> int:
        return gpu.pcie_kb_s[counter]

    def _fn_nvmlDeviceGetCurrPcieLinkGeneration(self, gpu: FakeGpu) -> int:
        return gpu.pcie_link[0]

    def _fn_nvmlDeviceGetCurrPcieLinkWidth(self, gpu: FakeGpu) -> int:
        return gpu.pcie_link[1]

    def _fn_nvmlDeviceGetNvLinkState(self, gpu: FakeGpu, link: int) -> int:
        if not gpu.nvlinks:
            raise NVMLError_NotSupported(NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return 1 if link < gpu.nvlinks else 0
