"""nbmonitor: a live training monitor inside your Jupyter notebook.

>>> import nbmonitor
>>> mon = nbmonitor.attach(model, optimizer, total_steps=500)  # doctest: +SKIP

Names load lazily: ``import nbmonitor`` loads no torch, so reading a run from disk
(``nbmonitor.open``, ``nbmonitor.list_runs``) works in a Python without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nbmonitor._version import __version__

if TYPE_CHECKING:
    from nbmonitor._hooks import NonFiniteError
    from nbmonitor._monitor import Monitor, attach
    from nbmonitor.debug import summary
    from nbmonitor.health import Thresholds
    from nbmonitor.runs import Run, RunDirError, list_runs
    from nbmonitor.runs import open_run as open

# public name -> (module, name there)
_WHERE = {
    "Monitor": ("nbmonitor._monitor", "Monitor"),
    "attach": ("nbmonitor._monitor", "attach"),
    "NonFiniteError": ("nbmonitor._hooks", "NonFiniteError"),
    "Run": ("nbmonitor.runs", "Run"),
    "RunDirError": ("nbmonitor.runs", "RunDirError"),
    "open": ("nbmonitor.runs", "open_run"),
    "list_runs": ("nbmonitor.runs", "list_runs"),
    "summary": ("nbmonitor.debug", "summary"),
    "Thresholds": ("nbmonitor.health", "Thresholds"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'nbmonitor' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "Monitor",
    "NonFiniteError",
    "Run",
    "RunDirError",
    "Thresholds",
    "__version__",
    "attach",
    "list_runs",
    "open",
    "summary",
]
