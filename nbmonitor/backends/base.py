"""The one contract every device backend fulfils (no ``getattr`` probing by its callers)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """A source of device and system statistics, sampled by the sampler thread.

    ``sample()`` returns the same keys every call (``keys``), with NaN for anything that cannot
    be read right now. It must not raise for an unavailable field; it may raise for a real
    failure, which the sampler counts and reports. ``notes`` only grows: facts worth showing
    the user (NVML missing, a GPU lost), which the monitor shows once each as info alerts.
    ``device_index`` is the accelerator the model trains on (None on the CPU).
    """

    name: str
    devices: tuple[str, ...]
    device_index: int | None
    notes: list[str]

    @property
    def keys(self) -> tuple[str, ...]: ...

    def sample(self) -> dict[str, float]: ...

    def device_gauges(self, sample: dict[str, float]) -> list[dict[str, float | str]]:
        """One dict of gauge values per accelerator (name, util, memory, ...) from a sample."""

    def close(self) -> None: ...
