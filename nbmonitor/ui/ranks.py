"""The ranks panel: a distributed job's ranks side by side, from a ``RanksFrame``.

A ranks x steps heatmap of step time (the dashboard's heatmap widget, ``_panel.Panel``), a
gauge card per rank's GPU and the host of the lowest rank, the cross-rank alerts (stragglers,
ranks that disagree), the newest steps with step time min / median / max and the slowest
rank, one row per rank (host, device, step time, data wait, device metrics, last loss and grad
norm, flags) and the cross-rank summary. The text tables also serve scripts
(``summary_text``). Widget libraries are imported only when a panel is made.
"""

from __future__ import annotations

import html
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nbmonitor._engine.frame import RanksFrame

SUMMARY_FIELDS = ("count", "mean", "median", "std", "min", "max", "min_rank", "max_rank")
RANK_COLUMNS = (
    ("rank", "rank"),
    ("host", "host"),
    ("device", "device"),
    ("status", "status"),
    ("steps", "steps"),
    ("step_time", "step time (s)"),
    ("phase_data_s", "data wait (s)"),
    ("gpu_util_percent", "GPU util %"),
    ("gpu_mem_used_bytes", "GPU mem (GiB)"),
    ("gpu_temperature_c", "GPU °C"),
    ("process_cpu_percent", "CPU %"),
    ("process_rss_bytes", "RSS (GiB)"),
    ("loss", "loss"),
    ("grad_norm", "grad norm"),
    ("flags", "flags"),
)
STEP_COLUMNS = (
    ("step", "step"),
    ("min", "min (s)"),
    ("median", "median (s)"),
    ("max", "max (s)"),
    ("slowest_rank", "slowest rank"),
)


def fmt(value: object, key: str = "") -> str:
    """A cell: bytes in GiB, ranks and steps as integers, NaN as a dash."""
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        return str(value)
    v = float(value)
    if not math.isfinite(v):
        return "–"
    if key.endswith("_bytes"):
        return f"{v / 2**30:.2f}"
    if key in ("step", "steps", "rank", "count") or key.endswith("_rank"):
        return f"{v:.0f}"
    return f"{v:.4g}"


def summary_rows(summary: Mapping[str, Mapping[str, float]]) -> list[list[str]]:
    """The cross-rank summary as text rows (a header, then one row per metric)."""
    rows = [["metric", *SUMMARY_FIELDS]]
    for metric, stats in summary.items():
        rows.append([metric, *(fmt(stats.get(f, math.nan), f) for f in SUMMARY_FIELDS)])
    return rows


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def summary_text(job: str, summary: Mapping[str, Mapping[str, float]]) -> str:
    """The cross-rank summary for a console: one line per metric."""
    return f"cross-rank summary of {job}:\n" + text_table(summary_rows(summary))


def status_line(frame: RanksFrame) -> str:
    """One line on a job for a console: ranks, newest step, step time across ranks, alerts."""
    parts = [f"{frame.job}: {len(frame.ranks)}/{frame.world_size} ranks"]
    if frame.per_step:
        row = frame.per_step[-1]
        ms = [fmt(row.get(k, math.nan) * 1e3) for k in ("min", "median", "max")]
        parts += [
            f"step {fmt(row.get('step', math.nan), 'step')}",
            f"step time min/median/max {'/'.join(ms)} ms",
            f"slowest rank {fmt(row.get('slowest_rank', math.nan), 'slowest_rank')}",
        ]
    if frame.alerts:
        parts.append(f"{len(frame.alerts)} alert(s); latest: {frame.alerts[-1].message}")
    if frame.status != "running":
        parts.append(frame.status)
    return " | ".join(parts)


class RanksConsoleView:
    """Logs ``status_line`` at most every ``every`` seconds, and the cross-rank summary and
    alerts at close: a job followed from a terminal."""

    wants_detail = False

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger, self._every, self._clock = logger, every, clock
        self._last = -math.inf
        self._closed = False

    def publish(self, frame: RanksFrame) -> None:
        now = self._clock()
        if not self._closed and now - self._last >= self._every:
            self._last = now
            self._logger.info(status_line(frame))

    def close(self, frame: RanksFrame) -> None:
        if not self._closed:
            self._closed = True
            lines = [status_line(frame), summary_text(frame.job, frame.summary)]
            lines += [f"  {a.message}" for a in frame.alerts]
            self._logger.info("\n".join(lines))


def _html_table(head: list[str], rows: list[list[str]], field: str) -> str:
    e = html.escape
    th = "".join(f"<th style='text-align:left;padding:0 6px'>{e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:0 6px'>{e(c)}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return (
        f"<table class='nbm-ranks-table' data-field='{field}'><thead><tr>{th}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def tables_html(frame: RanksFrame) -> str:
    """The per-step, per-rank and summary tables of ``frame`` as HTML."""
    steps = [[fmt(r.get(k, math.nan), k) for k, _ in STEP_COLUMNS] for r in frame.per_step[::-1]]
    ranks = [[fmt(r.get(k, math.nan), k) for k, _ in RANK_COLUMNS] for r in frame.table]
    summary = summary_rows(frame.summary)
    return (
        "<div class='nbm-ranks'>"
        "<div class='nbm-section-title'>Ranks</div>"
        + _html_table([h for _, h in RANK_COLUMNS], ranks, "ranks")
        + "<div class='nbm-section-title'>Step time across ranks (newest steps)</div>"
        + _html_table([h for _, h in STEP_COLUMNS], steps, "per_step")
        + "<div class='nbm-section-title'>Cross-rank summary</div>"
        + _html_table(summary[0], summary[1:], "summary")
        + "</div>"
    )


def _heat_state(frame: RanksFrame) -> tuple[dict[str, Any], bytes, bytes]:
    from nbmonitor.ui.dashboard import bound_heatmap

    heat = np.asarray(frame.heat, dtype=np.float64)
    if heat.ndim != 2 or heat.shape != (len(frame.ranks), len(frame.steps)) or not heat.size:
        return {}, b"", b""
    label = frame.heat_metric
    finite = heat[np.isfinite(heat)]
    if finite.size >= 100:
        # A few slow steps (the first, a checkpoint) would leave every other cell dark: the
        # colours stop at the 99th percentile, and the legend says so.
        cap = float(np.percentile(finite, 99))
        if cap < float(finite.max()):
            heat = np.minimum(heat, cap)  # NaN stays NaN
            label = f"{label} (capped at the 99th percentile)"
    grid, steps = bound_heatmap(heat, np.asarray(frame.steps, dtype=np.float64))
    meta = {
        "names": [f"rank{r} ({h})" for r, h in zip(frame.ranks, frame.hosts, strict=True)],
        "n_layers": int(grid.shape[0]),
        "n_steps": int(grid.shape[1]),
        "table": [],
        "title": f"{frame.heat_metric} per rank (ranks \u00d7 steps)",
        "label": label,
    }
    return meta, grid.tobytes(), steps.tobytes()


def _median(values: list[object]) -> float:
    """The median of the numbers among ``values`` (the ranks' last losses); NaN if none."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.median(numbers)) if numbers else math.nan


def _num(value: float) -> float | None:
    """JSON has no NaN: a value not known is sent as null."""
    return value if math.isfinite(value) else None


class RanksPanel:
    """Live or final view of a job's ranks. ``publish(frame)`` / ``close(frame)`` take
    ``RanksFrame``s; safe from any thread."""

    wants_detail = True

    def __init__(self, job: str) -> None:
        import ipywidgets as widgets

        from nbmonitor.ui._panel import Panel

        self.job = job
        self._lock = threading.Lock()
        self._closed = False
        self.last_frame: RanksFrame | None = None
        self._panel = Panel(
            header={"run": job, "backend": "ranks", "status": "running", "step": 0},
            system={},
            devices=[],
            alerts=[],
            errors=[],
            layers={},
        )
        self._tables = widgets.HTML("")
        self._box = widgets.VBox([self._panel, self._tables], layout=widgets.Layout(width="100%"))

    @property
    def widget(self) -> Any:
        return self._box

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, frame: RanksFrame) -> None:
        with self._lock:
            if not self._closed:
                self._apply(frame)

    def close(self, frame: RanksFrame) -> None:
        with self._lock:
            if self._closed:
                return
            self._apply(frame)
            self._closed = True

    def _apply(self, frame: RanksFrame) -> None:
        medians = [r.get("median", math.nan) for r in frame.per_step]
        last_step = frame.per_step[-1].get("step", 0.0) if frame.per_step else 0.0
        panel = self._panel
        with panel.hold_sync():
            panel.header = {
                "run": frame.job,
                "backend": f"{len(frame.ranks)}/{frame.world_size} ranks",
                "status": frame.status,
                "step": int(last_step) if math.isfinite(last_step) else 0,
                "total_steps": None,
                "step_time": medians[-1] if medians and math.isfinite(medians[-1]) else None,
                "loss": _num(_median([row.get("loss") for row in frame.table])),
            }
            panel.system = {k: _num(v) for k, v in (frame.system or {}).items()}
            panel.devices = [
                {k: (v if isinstance(v, str) else _num(v)) for k, v in d.items()}
                for d in frame.devices
            ]
            panel.alerts = [
                {"rule": a.rule, "severity": a.severity, "message": a.message, "step": a.step}
                for a in frame.alerts
            ]
            panel.layers, panel.layers_grid, panel.layers_steps = _heat_state(frame)
        self._tables.value = tables_html(frame)
        self.last_frame = frame

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self._box._repr_mimebundle_(**kwargs)
        data: dict[str, Any] = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
        frame = self.last_frame
        if frame is not None:
            data["text/plain"] = summary_text(frame.job, frame.summary)
            data["text/html"] = tables_html(frame)
        return data


__all__ = [
    "RanksConsoleView",
    "RanksPanel",
    "status_line",
    "summary_text",
    "tables_html",
    "text_table",
]
