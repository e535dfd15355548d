"""nbmonitor: a live training monitor inside your Jupyter notebook.

>>> import nbmonitor
>>> mon = nbmonitor.attach(model, optimizer, total_steps=500)  # doctest: +SKIP
"""

from nbmonitor._hooks import NonFiniteError
from nbmonitor._monitor import Monitor, attach
from nbmonitor._runlog import Run, RunDirError
from nbmonitor._runlog import open_run as open
from nbmonitor._version import __version__
from nbmonitor.debug import summary
from nbmonitor.health import Thresholds

__all__ = [
    "Monitor",
    "NonFiniteError",
    "Run",
    "RunDirError",
    "Thresholds",
    "__version__",
    "attach",
    "open",
    "summary",
]
