"""Energy per step and per sample on the training GPU, from its energy counter."""

from __future__ import annotations

import statistics

import numpy as np

from nbmonitor._engine.store import Store

WINDOW = 20


def energy_rates(system: Store, steps: Store, device_index: int | None) -> dict[str, float]:
    """Joules per step and per sample over the last ~20 samples ({} when unknown)."""
    key = f"gpu{device_index}_energy_j"
    if device_index is None or key not in system.columns:
        return {}
    energy, at = system.tail(key, WINDOW), system.tail("step", WINDOW)
    ok = np.isfinite(energy) & np.isfinite(at)
    if ok.sum() < 2 or at[ok][-1] <= at[ok][0]:
        return {}
    per_step = float((energy[ok][-1] - energy[ok][0]) / (at[ok][-1] - at[ok][0]))
    out = {"energy_per_step_j": per_step}
    if "samples" in steps.columns:
        samples = steps.tail("samples", WINDOW)
        samples = samples[np.isfinite(samples) & (samples > 0)]
        if samples.size:
            out["energy_per_sample_j"] = per_step / statistics.median(samples.tolist())
    return out
