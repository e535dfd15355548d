"""One figure overlaying a metric of several runs (``nbmonitor.compare``): a line per run,
decimated like the dashboard's, with a legend."""

from __future__ import annotations

from collections.abc import Mapping

from nbmonitor._engine.frame import Series
from nbmonitor.ui.figures import PALETTE, bq, lines_figure  # type: ignore[attr-defined]

__all__ = ["PALETTE", "compare_figure"]


def compare_figure(lines: Mapping[str, Series], metric: str, log: bool = False) -> bq.Figure:
    """A bqplot Figure with one line per run (name -> its series of ``metric``)."""
    return lines_figure(lines, f"{metric} by run", y_label=metric, log=log)
