"""The profile table in the cell: ``key_averages`` of a ``mon.profile()``, sortable by column.

An anywidget of its own (``static/profile.js``, built from ``js/src/panels/profile.js``): a
status line until the profiled steps have run, then one row per operator. Written from the
thread that finishes the profile; the rows are bounded (``MAX_ROWS`` in ``_capture/profiler.py``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anywidget
import traitlets

_STATIC = Path(__file__).resolve().parents[2] / "static"
_MISSING_ESM = """
export default { render({ el }) {
  el.textContent = "nbmonitor: the profile table front end is not built; run `npm run build` "
    + "in js/ (or `pip install -e .`).";
} };
"""


def _asset(name: str, fallback: str) -> Path | str:
    path = _STATIC / name
    return path if path.is_file() else fallback


def _cell(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ProfileTable(anywidget.AnyWidget):
    """Synced state of one profile table; ``ProfileView`` is its only writer."""

    _esm = _asset("profile.js", _MISSING_ESM)
    _css = _asset("widget.css", "")

    status = traitlets.Unicode("").tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    trace_path = traitlets.Unicode("").tag(sync=True)
    columns: traitlets.List[dict[str, str]] = traitlets.List().tag(sync=True)
    rows: traitlets.List[dict[str, object]] = traitlets.List().tag(sync=True)


class ProfileView:
    """A profile's table in the notebook, with a static HTML fallback for saved notebooks."""

    def __init__(self, columns: Sequence[Mapping[str, str]]) -> None:
        self.widget = ProfileTable(columns=[dict(c) for c in columns])

    def show_status(self, text: str) -> None:
        self.widget.status = text

    def show_error(self, text: str) -> None:
        with self.widget.hold_sync():
            self.widget.error = text
            self.widget.status = ""

    def show_rows(self, title: str, rows: Sequence[Mapping[str, object]], trace: str) -> None:
        with self.widget.hold_sync():
            self.widget.title = title
            self.widget.trace_path = trace
            self.widget.rows = [{k: _cell(v) for k, v in row.items()} for row in rows]
            self.widget.status = ""

    def display(self) -> None:
        """Show the table in the current cell's output (main thread)."""
        from IPython.display import display

        display(self)  # type: ignore[no-untyped-call]

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle: Any = self.widget._repr_mimebundle_(**kwargs)
        data: dict[str, Any] = dict(bundle[0] if isinstance(bundle, tuple) else bundle or {})
        data["text/plain"] = self.summary_text()
        data["text/html"] = self.summary_html()
        return data

    def summary_text(self) -> str:
        w = self.widget
        if w.error:
            return f"nbmonitor profile: {w.error}"
        if not w.rows:
            return f"nbmonitor profile: {w.status or 'no result yet'}"
        return f"nbmonitor profile: {w.title}, {len(w.rows)} operators, trace {w.trace_path}"

    def summary_html(self, max_rows: int = 20) -> str:
        w = self.widget
        if w.error or not w.rows:
            return f"<div class='nbmonitor-summary'>{html.escape(self.summary_text())}</div>"
        head = "".join(f"<th>{html.escape(c['label'])}</th>" for c in w.columns)
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(_text(row.get(c['key'])))}</td>" for c in w.columns)
            + "</tr>"
            for row in w.rows[:max_rows]
        )
        return (
            f"<div class='nbmonitor-summary'><b>{html.escape(w.title)}</b>"
            f"<table><tr>{head}</tr>{body}</table></div>"
        )


def _text(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
