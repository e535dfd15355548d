"""NVML clock-event ("throttle") reasons: the bit table and its decoding.

Shared by the CUDA backend (its gauges) and the device health rules; kept outside
``backends/`` and free of torch so that ``nbmonitor.health`` can read it without importing
the backends package (which selects devices with torch).
"""

from __future__ import annotations

# Clock-event (formerly "throttle") reason bits, as nvmlClocksEventReason* in nvidia-ml-py.
# Written out rather than read from pynvml so decoding works where nvidia-ml-py is absent;
# tests check them against the installed module.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# The reasons that mean the GPU runs slower than it could because of heat or power.
THROTTLING_MASK = 0x004 | 0x008 | 0x020 | 0x040 | 0x080


def decode_throttle(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in ``mask``; unknown bits as hex (``"0x200"``)."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(hex(bit))
            rest &= ~bit
        bit <<= 1
    return names


__all__ = ["THROTTLE_REASONS", "THROTTLING_MASK", "decode_throttle"]
