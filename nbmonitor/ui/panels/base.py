"""What a panel is on the Python side, and the curves panel most of them are.

A panel turns what the engine built (a ``Frame``, or a ``RanksFrame`` for the ranks panel) into
the JSON-and-binary state of its widget trait ``panel_<name>``; the JS module of the same name
(``js/src/panels/<name>.js``) draws it. ``state`` returns ``None`` when nothing changed, so that
the dashboard sends nothing for that panel: a publish carries only the panels that moved.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Frame, Series
from nbmonitor.ui.codec import encode

Transform = Callable[[npt.NDArray[np.float64], Mapping[str, float]], npt.NDArray[np.float64]]


class Panel(Protocol):
    """One tab of the dashboard (or the whole of a smaller view)."""

    name: ClassVar[str]  # the trait is panel_<name>; js/src/panels/<name>.js draws it

    def state(self, frame: Any) -> dict[str, Any] | None:
        """The panel's new state, or None when it has not changed since the last call."""
        ...


def series_state(series: Series, y: npt.NDArray[np.float64] | None = None) -> dict[str, Any]:
    """One curve, ``{x, y}`` in the codec; a malformed series must not desync x and y."""
    values = series.y if y is None else y
    n = min(len(series.x), len(values))
    return {"x": encode(series.x[:n]), "y": encode(values[:n])}


class Unchanged:
    """Remembers the last state sent, so that a panel sends nothing when it would repeat it."""

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    def filter(self, state: dict[str, Any]) -> dict[str, Any] | None:
        if state == self._last:
            return None
        self._last = state
        return state


class CurvesPanel:
    """A panel of curves against the step: the Frame series it names, only when they changed.

    The JS module lays them out (which curves share a chart, titles, colours, units); this side
    picks the series, applies unit transforms that need the frame (a memory share of a total)
    and adds short notes (the clipping summary in the gradient-norm title).
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._unchanged = Unchanged()

    def keys(self, frame: Frame) -> list[tuple[str, Transform | None]]:
        raise NotImplementedError

    def notes(self, frame: Frame) -> dict[str, Any]:
        return {}

    def extra(self, frame: Frame) -> dict[str, Any]:
        """More of the panel's state, beside its series and notes (JSON)."""
        return {}

    def state(self, frame: Frame) -> dict[str, Any] | None:
        curves: dict[str, Any] = {}
        for key, transform in self.keys(frame):
            s = frame.series.get(key)
            if s is None or not len(s.x):
                continue
            y = None if transform is None else transform(s.y, frame.latest)
            curves[key] = series_state(s, y)
        state = {"series": curves, "notes": self.notes(frame), **self.extra(frame)}
        return self._unchanged.filter(state)
