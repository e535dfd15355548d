"""Apple GPUs through torch.mps: the allocator's view of unified memory, plus CPU/RAM."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable

import torch

from nbmonitor.backends.cpu import CPU_KEYS, CpuBackend

MPS_KEYS = ("mps_allocated_bytes", "mps_driver_allocated_bytes", "mps_recommended_max_bytes")


def _read(name: str) -> float:
    """``torch.mps.<name>()`` as a float; NaN where this torch lacks it or it fails."""
    fn: Callable[[], int] | None = getattr(getattr(torch, "mps", None), name, None)
    if fn is None:
        return math.nan
    try:
        return float(fn())
    except (RuntimeError, AttributeError, AssertionError):
        return math.nan


def chip_name() -> str:
    """The Mac's chip ("Apple M2 Pro"), which names its GPU; "Apple" where it cannot be read."""
    if sys.platform != "darwin":
        return "Apple"
    try:
        done = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True,
            text=True,
            timeout=2,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "Apple"
    name = done.stdout.strip()
    return name if name.startswith("Apple") else "Apple"


class MpsBackend:
    """CPU/RAM (from :class:`CpuBackend`) plus MPS memory.

    There is no public utilisation, power or temperature counter for Apple GPUs (that needs
    root and ``powermetrics``), so memory is what this backend adds. MPS memory is unified
    with system RAM: ``mps_recommended_max_bytes`` is Metal's suggested working-set ceiling,
    the closest thing to a "total".
    """

    name = "mps"

    def __init__(self) -> None:
        # The chip names the GPU, so that MFU finds its peak (_engine/derive/mfu.py).
        self.devices: tuple[str, ...] = (f"{chip_name()} GPU (MPS)",)
        self.device_index: int | None = None
        self.notes: list[str] = []
        self._cpu = CpuBackend()

    @property
    def keys(self) -> tuple[str, ...]:
        return CPU_KEYS + MPS_KEYS

    def sample(self) -> dict[str, float]:
        out = self._cpu.sample()
        out["mps_allocated_bytes"] = _read("current_allocated_memory")
        out["mps_driver_allocated_bytes"] = _read("driver_allocated_memory")
        out["mps_recommended_max_bytes"] = _read("recommended_max_memory")
        return out

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """One gauge: tensor memory against Metal's recommended maximum."""
        return [
            {
                "name": self.devices[0],
                "index": 0.0,
                "mem_used_bytes": sample.get("mps_allocated_bytes", math.nan),
                "mem_total_bytes": sample.get("mps_recommended_max_bytes", math.nan),
                "driver_allocated_bytes": sample.get("mps_driver_allocated_bytes", math.nan),
            }
        ]

    def close(self) -> None:
        self._cpu.close()
