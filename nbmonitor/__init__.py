"""nbmonitor: a live training monitor inside your Jupyter notebook.

>>> import nbmonitor
>>> mon = nbmonitor.attach(model, optimizer, total_steps=500)  # doctest: +SKIP

Names load lazily: ``import nbmonitor`` loads no torch, so reading a run from disk
(``nbmonitor.open``) works in a Python without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nbmonitor._lazy import lazy_names
from nbmonitor._version import __version__

if TYPE_CHECKING:
    from nbmonitor import export
    from nbmonitor.debug import summary
    from nbmonitor.errors import NonFiniteError, RunDirError, StopTraining
    from nbmonitor.health import Thresholds
    from nbmonitor.live import Monitor, Profile, attach
    from nbmonitor.machine import DeviceWatch, devices
    from nbmonitor.replay import Job, Run, compare, open, tail
    from nbmonitor.runs import list_runs

# public name -> module it lives in
_WHERE = {
    "Monitor": "nbmonitor.live",
    "attach": "nbmonitor.live",
    "NonFiniteError": "nbmonitor.errors",
    "RunDirError": "nbmonitor.errors",
    "StopTraining": "nbmonitor.errors",
    "Run": "nbmonitor.replay",
    "Job": "nbmonitor.replay",
    "open": "nbmonitor.replay",
    "tail": "nbmonitor.replay",
    "compare": "nbmonitor.replay",
    "list_runs": "nbmonitor.runs",
    "summary": "nbmonitor.debug",
    "Thresholds": "nbmonitor.health",
    "Profile": "nbmonitor.live",
    "devices": "nbmonitor.machine",
    "DeviceWatch": "nbmonitor.machine",
}


# Submodules that are public namespaces (``nbmonitor.export.TensorBoard(...)``).
_MODULES = ("export",)
_lazy_getattr = lazy_names(__name__, _WHERE)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE, *_MODULES])


__all__ = [
    "DeviceWatch",
    "Job",
    "Monitor",
    "NonFiniteError",
    "Profile",
    "Run",
    "RunDirError",
    "StopTraining",
    "Thresholds",
    "__version__",
    "attach",
    "compare",
    "devices",
    "export",
    "list_runs",
    "open",
    "summary",
    "tail",
]
