"""The view of a distributed job: the ranks panel (``panels/ranks.py``) in the dashboard's
widget, with the header, a gauge card per rank's GPU and the host of the lowest rank, and the
cross-rank alerts (stragglers, ranks that disagree); and the console view and text tables that
serve scripts (``summary_text``, ``status_line``). Widget libraries are imported only when a
panel is made.
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
from nbmonitor.ui.console import LINE_WIDTH, PREFIX
from nbmonitor.ui.panels import ranks as panels
from nbmonitor.ui.panels.ranks import (
    fmt,
    summary_rows,
    tables,
)


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def summary_text(job: str, summary: Mapping[str, Mapping[str, float]]) -> str:
    """The cross-rank summary for a console: one line per metric."""
    return f"cross-rank summary of {job}:\n" + text_table(summary_rows(summary))


def status_line(frame: RanksFrame, width: int = LINE_WIDTH - len(PREFIX)) -> str:
    """One line on a job for a console: ranks, newest step, step time across ranks, alerts;
    at most ``width`` characters: the slowest rank, then the step times, are left out until
    the newest alert's start fits, cut with an ellipsis (the closing summary has it whole)."""
    head = [f"{frame.job}: {len(frame.ranks)}/{frame.world_size} ranks"]
    optional: list[str] = []  # left out from the end first
    if frame.per_step:
        row = frame.per_step[-1]
        ms = [fmt(row.get(k, math.nan) * 1e3) for k in ("min", "median", "max")]
        head.append(f"step {fmt(row.get('step', math.nan), 'step')}")
        optional += [
            f"min/median/max {'/'.join(ms)} ms",
            f"slowest rank {fmt(row.get('slowest_rank', math.nan), 'slowest_rank')}",
        ]
    tail = [frame.status] if frame.status != "running" else []
    room = width
    while True:
        parts = head + optional + tail
        if not frame.alerts:
            line = " | ".join(parts)
        else:
            count = f"{len(frame.alerts)} alert(s)"
            lead = f"{count}; latest: "
            room = width - len(" | ".join([*parts, lead]))
            message = frame.alerts[-1].message
            if room >= 20:
                cut = message if len(message) <= room else message[: room - 1].rstrip() + "…"
                line = " | ".join([*parts, lead + cut])
            else:
                line = " | ".join([*parts, count])
        if (len(line) <= width and (not frame.alerts or room >= 20)) or not optional:
            return line
        optional.pop()


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
    """The per-rank, per-step and summary tables of ``frame`` as HTML (the static fallback)."""
    parts = ["<div class='nbm-ranks'>"]
    for table in tables(frame):
        parts.append(f"<div class='nbm-section-title'>{html.escape(table['title'])}</div>")
        parts.append(_html_table(table["head"], table["rows"], table["field"]))
    return "".join(parts) + "</div>"


def _median(values: list[object]) -> float:
    """The median of the numbers among ``values`` (the ranks' last losses); NaN if none."""
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.median(numbers)) if numbers else math.nan


def _num(value: float) -> float | None:
    """JSON has no NaN: a value not known is sent as null."""
    return value if math.isfinite(value) else None


class RanksDashboard:
    """Live or final view of a job's ranks. ``publish(frame)`` / ``close(frame)`` take
    ``RanksFrame``s; safe from any thread."""

    wants_detail = True

    def __init__(self, job: str) -> None:
        from nbmonitor.ui.widget import DashboardWidget

        self.job = job
        self._lock = threading.Lock()
        self._closed = False
        self.last_frame: RanksFrame | None = None
        self._ranks = panels.RanksPanel()
        self._widget = DashboardWidget(
            header={"run": job, "backend": "ranks", "status": "running", "step": 0},
            panels=[self._ranks.name],
        )

    @property
    def widget(self) -> Any:
        return self._widget

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
        w = self._widget
        with w.hold_sync():
            w.header = {
                "run": frame.job,
                "backend": f"{len(frame.ranks)}/{frame.world_size} ranks",
                "status": frame.status,
                "step": int(last_step) if math.isfinite(last_step) else 0,
                "total_steps": None,
                "step_time": medians[-1] if medians and math.isfinite(medians[-1]) else None,
                "loss": _num(_median([row.get("loss") for row in frame.table])),
            }
            w.system = {k: _num(v) for k, v in (frame.system or {}).items()}
            w.devices = [
                {k: (v if isinstance(v, str) else _num(v)) for k, v in d.items()}
                for d in frame.devices
            ]
            w.alerts = [
                {"rule": a.rule, "severity": a.severity, "message": a.message, "step": a.step}
                for a in frame.alerts
            ]
            state = self._ranks.state(frame)
            if state is not None:
                setattr(w, f"panel_{self._ranks.name}", state)
        self.last_frame = frame

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = self._widget._repr_mimebundle_(**kwargs)
        data: dict[str, Any] = dict((bundle[0] if isinstance(bundle, tuple) else bundle) or {})
        frame = self.last_frame
        if frame is not None:
            data["text/plain"] = summary_text(frame.job, frame.summary)
            data["text/html"] = tables_html(frame)
        return data


__all__ = [
    "RanksConsoleView",
    "RanksDashboard",
    "status_line",
    "summary_text",
    "tables_html",
    "text_table",
]
