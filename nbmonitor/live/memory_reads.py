"""``Monitor.memory()``: the breakdown read now from the tensors while the model lives, else the
newest one the sampler published (a released run)."""

from __future__ import annotations

from nbmonitor._capture.probes.memory import MemoryProbe
from nbmonitor.memory import MemoryBreakdown


def live_memory(
    probe: MemoryProbe | None, published: MemoryBreakdown | None, step: int
) -> MemoryBreakdown:
    if probe is not None:
        return probe.now(step)
    return published if published is not None else MemoryBreakdown(())
