"""Many new steps in one check, cut into slices the rules judge one after the other.

A run shorter than one check interval, or checks that the pacing put seconds apart, bring
hundreds of new steps at once. Judged as one block, a rule compares them with the little
history before them, and misses what happened in the middle; judged in slices, each slice has
the steps before it as reference, as if the rules had run every few dozen steps.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from nbmonitor.health.view import HealthInput, new_from
from nbmonitor.health.window import FloatArray

# A check with more new steps than this is judged in slices: a first one of this many steps
# (the reference the next ones are judged against, for a run that arrives in one check) ...
FIRST_SLICE = 32
# ... then slices of this many steps or more ...
SLICE_STEPS = 64
# ... at most this many of them (each slice costs a pass of every rule).
MAX_SLICES = 4


def slices(inp: HealthInput, last_step: float | None) -> list[HealthInput]:
    """``inp`` cut at step boundaries into inputs that end after each slice, oldest first;
    the last is ``inp`` itself. System samples and the other ranks' columns go with the last
    slice only; the activation
    statistics, a snapshot of a lasting condition (dead units), with every slice."""
    col = inp.steps.get("step")
    if col is None:
        return [inp]
    steps = np.asarray(col, dtype=np.float64)
    first = new_from(steps, last_step)
    fresh = steps.size - first
    if fresh <= FIRST_SLICE:
        return [inp]
    size = max(SLICE_STEPS, math.ceil((fresh - FIRST_SLICE) / MAX_SLICES))
    ends = range(first + FIRST_SLICE, steps.size, size)
    return [_until(inp, steps, end) for end in ends] + [inp]


def _until(inp: HealthInput, steps: FloatArray, end: int) -> HealthInput:
    """``inp`` as a check after row ``end - 1`` would have seen it."""
    last = float(steps[end - 1])
    columns = {k: v[:end] for k, v in inp.steps.items() if len(v) == steps.size}
    times = columns.get("time")
    when = float(times[-1]) if times is not None and math.isfinite(times[-1]) else inp.time
    layer_steps, grads = inp.layer_steps, inp.layer_grad_norms
    if layer_steps is not None and grads is not None and grads.shape[-1] == layer_steps.size:
        keep = int(np.searchsorted(layer_steps, last, side="right"))
        layer_steps, grads = layer_steps[:keep], grads[:, :keep]
    update_steps, series, ratios = inp.update_steps, inp.update_series, inp.update_ratios
    params, norms = inp.param_series, inp.param_norms
    if update_steps is not None and series is not None and series.shape[-1] == update_steps.size:
        keep = int(np.searchsorted(update_steps, last, side="right"))
        update_steps, series = update_steps[:keep], series[:, :keep]
        ratios = series[:, -1] if keep else None
        if params is not None and params.shape[-1] >= max(keep, 1):
            # The parameter norms as they were then (a later explosion changes them).
            norms = params[:, keep - 1] if keep else params[:, 0]
            params = params[:, :keep]
    return dataclasses.replace(
        inp,
        step=int(last),
        time=when,
        steps=columns,
        layer_steps=layer_steps,
        layer_grad_norms=grads,
        update_steps=update_steps,
        update_series=series,
        update_ratios=ratios,
        param_series=params,
        param_norms=norms,
        system=None,
        ranks=None,
    )


__all__ = ["FIRST_SLICE", "MAX_SLICES", "SLICE_STEPS", "slices"]
