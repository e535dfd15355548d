"""Views of a run: the notebook dashboard (anywidget + bqplot) and notebook helpers.

``Dashboard`` is imported lazily: importing widget libraries costs ~0.5 s, which a plain
script that only asks ``in_notebook()`` should not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nbmonitor.ui.notebook import in_notebook, show
from nbmonitor.ui.view import View

if TYPE_CHECKING:
    from nbmonitor.ui.dashboard import Dashboard

__all__ = ["Dashboard", "View", "in_notebook", "show"]


def __getattr__(name: str) -> Any:
    if name == "Dashboard":
        from nbmonitor.ui.dashboard import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
