"""Where the rules are judged: at grid points fixed by the data, whatever the checks' pace.

A check brings whatever steps arrived since the last one: a few on a slow run, hundreds on a
fast one or a loaded machine whose checks the pacing put seconds apart. If the rules judged
each check's steps as one block, what they found (and the step an alert names) would depend
on where the checks happened to fall, i.e. on the machine's speed. So a check is cut at grid
points that depend only on the data, and each slice is judged as if a check had run exactly
there, oldest first:

- a **step grid**: every ``GRID_STEPS`` steps (steps 16, 32, 48, ...), coarser as the run
  grows (``GRID_PER_DOUBLING`` points from one power of two of the step to the next: every
  32 steps from step 512, every 64 from 1,024, ...), so a long fast run costs a few passes
  a second, not hundreds;
- a **time grid**: a row whose own wall time (the ``time`` column, as recorded) is
  ``GRID_SECONDS`` after the previous grid point's, so a slow run is judged every few
  seconds however coarse its step grid.

Steps after the newest grid point wait for the next check (``final=False``) or are judged as
they are (``final=True``: the run closed, a flush, a run read from disk). Each slice sees at
most ``LOOKBACK`` rows before its new ones (what a live check sees: ``HEALTH_WINDOW``), so a
pass costs the same at step 100 and at step 100,000.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from nbmonitor.health.view import HealthInput
from nbmonitor.health.window import FloatArray

# The step grid: every GRID_STEPS steps, or GRID_PER_DOUBLING points between consecutive
# powers of two where that is coarser (from step 512 = 16 * 32 on).
GRID_STEPS = 16
GRID_PER_DOUBLING = 16
# The time grid: a row this many seconds (its own recorded time) after the last grid point.
GRID_SECONDS = 5.0
# Rows before a slice's new ones that its rules see (the longest window a rule reads is
# plateau_window, 200 steps by default; the live pipeline gives HEALTH_WINDOW = 512).
LOOKBACK = 512


def grid_end(steps: FloatArray) -> FloatArray:
    """The grid point at or after each step: the step that closes its slice."""
    s = np.maximum(steps, 1.0)
    every = np.maximum(GRID_STEPS, 2.0 ** np.floor(np.log2(s)) / GRID_PER_DOUBLING)
    # Powers of two are multiples of every spacing at or below them, so the grids of two
    # octaves meet there: a step's grid point never moves back when the spacing grows.
    return np.ceil(steps / every) * every


def grid_point(step: float) -> float:
    """``grid_end`` of one step, in plain floats (the same operations: ``math`` and numpy
    round alike on these)."""
    s = max(step, 1.0)
    every = max(float(GRID_STEPS), 2.0 ** math.floor(math.log2(s)) / GRID_PER_DOUBLING)
    return math.ceil(step / every) * every


def _step_ends(steps: FloatArray, first: int) -> list[int]:
    """The rows (exclusive ends) at which the step grid closes a slice, from row ``first``.

    A row closes its slice when the next row is in a later one, or when it is the grid point
    itself (steps are whole numbers: no later step can share its slice). The grid point is
    never behind a step and is its own (``grid_end``), so on ascending steps the rows of one
    slice are those up to its grid point: one search a slice, not ``grid_end`` on each of a
    check's thousands of new rows."""
    n = steps.size
    tail = steps[first:]
    if not (tail[1:] >= tail[:-1]).all():  # not ascending (never from a store): row by row
        ends = grid_end(tail)
        closes = np.empty(n - first, dtype=bool)
        closes[:-1] = ends[1:] != ends[:-1]
        closes[-1] = steps[-1] == ends[-1]
        out: list[int] = (np.flatnonzero(closes) + first + 1).tolist()
        return out
    out = []
    row = first
    last = float(steps[-1])
    while row < n:
        point = grid_point(float(steps[row]))
        if point >= last:
            if point == last:
                out.append(n)
            break
        row = first + int(tail.searchsorted(point, side="right"))
        out.append(row)
    return out


@dataclasses.dataclass(frozen=True)
class Cut:
    """One slice to judge: the rows before ``end``; ``grid`` when it ends at a grid point
    (False: the newest rows, judged as they are on a final check)."""

    end: int
    grid: bool


def cuts(
    steps: FloatArray,
    times: FloatArray | None,
    first: int,
    grid_time: float | None,
    final: bool,
) -> list[Cut]:
    """The slices the new rows (from row ``first``) are judged in, oldest first.

    ``grid_time`` is the recorded time of the previous grid point (None: none yet, the time
    grid starts at the first new row)."""
    n = steps.size
    if first >= n:
        return []
    step_ends = _step_ends(steps, first)
    out: list[Cut] = []
    have_times = times is not None and times.size == n
    anchor = grid_time
    if have_times and anchor is None:
        assert times is not None
        anchor = float(times[first]) if math.isfinite(times[first]) else None
    # Times in order (as a store's are; no NaN): the time grid's next row is one search.
    ascending = False
    if have_times:
        assert times is not None
        recent = times[first:]
        ascending = bool((recent[1:] >= recent[:-1]).all())
    row, k = first, 0
    while row < n:
        end = step_ends[k] if k < len(step_ends) else n + 1
        if have_times and anchor is not None:
            assert times is not None
            if ascending:
                at = max(row, first + int(recent.searchsorted(anchor + GRID_SECONDS)))
                if at < min(end, n):
                    end = at + 1
            else:
                late = np.flatnonzero(times[row : min(end, n)] >= anchor + GRID_SECONDS)
                if late.size:
                    end = row + int(late[0]) + 1
        if end > n:
            break
        out.append(Cut(end, True))
        while k < len(step_ends) and step_ends[k] <= end:
            k += 1
        if have_times:
            assert times is not None
            when = float(times[end - 1])
            anchor = when if math.isfinite(when) else anchor
        row = end
    if final and (not out or out[-1].end < n):
        out.append(Cut(n, False))
    return out


def until(inp: HealthInput, steps: FloatArray, start: int, end: int, now: bool) -> HealthInput:
    """``inp`` as a check after row ``end - 1`` would have seen it, with at most ``LOOKBACK``
    rows before row ``start`` (the first it judges). ``now``: this slice also judges what is
    true now (system samples, the other ranks), which go with one slice per check; the
    activation statistics, a snapshot of a lasting condition (dead units), go with every
    slice."""
    lo = max(0, start - LOOKBACK)
    if lo == 0 and end == steps.size:
        return inp if now else dataclasses.replace(inp, system=None, ranks=None)
    last = float(steps[end - 1]) if end else -math.inf
    begin = float(steps[lo]) if end else -math.inf
    columns = {k: v[lo:end] for k, v in inp.steps.items() if len(v) == steps.size}
    times = columns.get("time")
    when = float(times[-1]) if times is not None and end and math.isfinite(times[-1]) else inp.time
    layer_steps, grads = inp.layer_steps, inp.layer_grad_norms
    if layer_steps is not None and grads is not None and grads.shape[-1] == layer_steps.size:
        a = int(np.searchsorted(layer_steps, begin, side="left"))
        b = int(np.searchsorted(layer_steps, last, side="right"))
        layer_steps, grads = layer_steps[a:b], grads[:, a:b]
    update_steps, series, ratios = inp.update_steps, inp.update_series, inp.update_ratios
    params, norms = inp.param_series, inp.param_norms
    if series is None and not now:
        ratios = None  # the newest ratios alone, without their steps, are what is true now
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
        step=int(last) if 0 < end < steps.size else inp.step,
        time=when if end < steps.size else inp.time,
        steps=columns,
        layer_steps=layer_steps,
        layer_grad_norms=grads,
        update_steps=update_steps,
        update_series=series,
        update_ratios=ratios,
        param_series=params,
        param_norms=norms,
        system=inp.system if now else None,
        ranks=inp.ranks if now else None,
        structure=inp.structure.until(last) if inp.structure is not None else None,
    )


__all__ = [
    "GRID_PER_DOUBLING",
    "GRID_SECONDS",
    "GRID_STEPS",
    "LOOKBACK",
    "Cut",
    "cuts",
    "grid_end",
    "grid_point",
    "until",
]
