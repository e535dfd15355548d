"""The static fallback: the dashboard's main curves as inline SVG in the output's text/html.

A notebook saved with its outputs and opened where no kernel runs (nbviewer, GitHub, an
nbconvert export) cannot draw the widget; front ends then show the bundle's text/html, which
carries the final numbers and these small charts. Plain SVG, no script, no external resource,
each curve cut to ``POINTS`` points so the saved notebook stays small.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping

import numpy as np

from nbmonitor._engine.frame import Series

POINTS = 300
WIDTH, HEIGHT, PAD = 240, 90, 4
# (title, series key, log scale)
CHARTS = (
    ("loss", "loss_smooth", False),
    ("learning rate", "lr", False),
    ("gradient norm", "grad_norm", True),
    ("step time (s)", "step_time_median", False),
    ("samples/s", "samples_per_s", False),
    ("tokens/s", "tokens_per_s", False),
)


def si(value: float) -> str:
    """A short number for a chart label: 18k, 3e-4, 0.25, 1.2M."""
    if not math.isfinite(value):
        return "–"
    a = abs(value)
    if a == 0:
        return "0"
    if a < 1e-2:
        return f"{value:.0e}".replace("e-0", "e-")
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _path(x: np.ndarray, y: np.ndarray, log: bool) -> tuple[str, float, float]:
    keep = np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else True)
    x, y = x[keep], y[keep]
    if len(x) > POINTS:
        idx = np.linspace(0, len(x) - 1, POINTS).astype(np.int64)
        x, y = x[idx], y[idx]
    if not len(x):
        return "", math.nan, math.nan
    lo, hi = float(y.min()), float(y.max())
    v = np.log10(y) if log else y
    vlo, vhi = float(v.min()), float(v.max())
    xlo, xhi = float(x[0]), float(x[-1])
    sx = (WIDTH - 2 * PAD) / (xhi - xlo) if xhi > xlo else 0.0
    sy = (HEIGHT - 2 * PAD) / (vhi - vlo) if vhi > vlo else 0.0
    px = PAD + (x - xlo) * sx
    py = HEIGHT - PAD - ((v - vlo) * sy if sy else np.full(len(v), (HEIGHT - 2 * PAD) / 2))
    points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px.tolist(), py.tolist(), strict=True))
    return f"M{points.replace(' ', ' L', len(x) - 1)}", lo, hi


def charts_svg(series: Mapping[str, Series]) -> str:
    """Small SVG charts of the run's main curves, or "" when there are none."""
    cells = []
    for title, key, log in CHARTS:
        s = series.get(key)
        if s is None:
            continue
        d, lo, hi = _path(np.asarray(s.x, np.float64), np.asarray(s.y, np.float64), log)
        if not d:
            continue
        label = html.escape(f"{title}: {si(lo)} – {si(hi)}{' (log)' if log else ''}")
        cells.append(
            "<figure style='display:inline-block;margin:4px 8px'>"
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' role='img' aria-label='{label}'>"
            f"<rect width='{WIDTH}' height='{HEIGHT}' fill='none' stroke='#8884'/>"
            f"<path d='{d}' fill='none' stroke='#1f77b4' stroke-width='1.5'/></svg>"
            f"<figcaption style='font-size:11px'>{label}</figcaption></figure>"
        )
    return f"<div class='nbmonitor-charts'>{''.join(cells)}</div>" if cells else ""
