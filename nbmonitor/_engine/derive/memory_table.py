"""The Memory tab's table: what holds memory on each device, from the newest breakdown
(``nbmonitor.memory.MemoryBreakdown``) and the newest system sample.

One row per device the breakdown names (and the device the model trains on): the bytes of
parameters, buffers, gradients, optimizer state and activations saved for backward, what was
measured on that device (on CUDA the newest interval's peak, else what is allocated; on the CPU
the process's resident size) and ``other``, the measured bytes the categories do not account
for (temporaries, workspaces, the interpreter and libraries on the CPU), never below 0. The
categories are read at the end of a sampled step and the measure at the newest sample, so
``other`` is an approximation; NaN where nothing is measured on the device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from nbmonitor._engine.store import Store
from nbmonitor.memory import CATEGORIES, MemoryBreakdown

# Per device kind: the system columns that measure it, the first finite one wins.
_MEASURED = {
    "cuda": ("cuda_interval_peak_bytes", "cuda_allocated_bytes"),
    "cpu": ("process_rss_bytes",),
}
_WHAT = {
    "cuda_interval_peak_bytes": "peak of the last interval",
    "cuda_allocated_bytes": "allocated",
    "process_rss_bytes": "resident size",
}
MAX_DEVICES = 16
MAX_ALLOCATOR_TEXT = 200


def allocator_text(allocator: object) -> str:
    """The CUDA allocator's settings as meta.json's ``"allocator"`` says them (an untrusted
    value on a run read from disk): ``"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"``,
    ``"default settings"`` when no variable was set, ``""`` when unknown."""
    if not isinstance(allocator, Mapping):
        return ""
    variable, text = allocator.get("variable"), allocator.get("text")
    if variable is None:
        return "default settings"
    if not isinstance(variable, str) or not isinstance(text, str):
        return ""
    return f"{variable[:60]}={text}"[:MAX_ALLOCATOR_TEXT]


@dataclass(frozen=True)
class MemoryTable:
    """The rows of the Memory tab's table: per device, ``device``, one column per category
    (``nbmonitor.memory.CATEGORIES``), ``measured``, ``measured_what`` and ``other``;
    ``step`` the breakdown's step, ``activations_step`` its sampled step (None: none yet)."""

    step: int
    activations_step: int | None
    rows: tuple[dict[str, object], ...]


def _newest(system: Store, key: str) -> float:
    if key not in system.columns:
        return math.nan
    values = system.tail(key, 8)
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def _measured(system: Store, device: str, device_index: int | None) -> tuple[float, str]:
    kind = device.split(":", 1)[0]
    if kind == "cuda" and device != f"cuda:{device_index}":
        return math.nan, ""  # the samples measure the training device only
    for key in _MEASURED.get(kind, ()):
        value = _newest(system, key)
        if math.isfinite(value):
            return value, _WHAT[key]
    return math.nan, ""


def memory_table(
    breakdown: MemoryBreakdown | None, system: Store, device_index: int | None
) -> MemoryTable | None:
    """The table, or None before the first breakdown."""
    if breakdown is None:
        return None
    devices = list(dict.fromkeys(r.device for r in breakdown.rows))
    home = f"cuda:{device_index}" if device_index is not None else "cpu"
    if home not in devices:
        devices.insert(0, home)
    rows: list[dict[str, object]] = []
    for device in devices[:MAX_DEVICES]:
        row: dict[str, object] = {"device": device}
        counted = 0
        for category in CATEGORIES:
            n = breakdown.bytes(category, device=device)
            row[category] = float(n)
            counted += n
        measured, what = _measured(system, device, device_index)
        row["measured"] = measured
        row["measured_what"] = what
        row["other"] = max(0.0, measured - counted) if math.isfinite(measured) else math.nan
        rows.append(row)
    return MemoryTable(breakdown.step, breakdown.activations_step, tuple(rows))
