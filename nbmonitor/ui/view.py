"""What the monitor asks of a view: the ``View`` protocol, declared beside the Frame it takes."""

from __future__ import annotations

from nbmonitor._engine.frame import Frame, View

__all__ = ["Frame", "View"]
