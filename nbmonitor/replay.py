"""Runs on disk: open a finished or running run, tail one another process writes, list runs.

The second composition root (beside ``monitor.py``): it reads ``runs/`` and feeds the same
FrameBuilder and views as a live run. Importing it loads no torch.
"""

from __future__ import annotations

from nbmonitor._runlog import Run
from nbmonitor._runlog import open_run as open

__all__ = ["Run", "open"]
