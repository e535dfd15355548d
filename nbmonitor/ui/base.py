"""What the monitor asks of a view."""

from __future__ import annotations

from typing import Protocol

from nbmonitor._engine.frame import Frame


class View(Protocol):
    """Something that shows Frames. Called from the sampler thread only; never raises on purpose.

    ``publish`` shows the newest frame; ``close`` shows the final one (status "closed") and
    releases the view's feed. Neither may call ``display()`` or ``print()``. A view may set a
    class attribute ``wants_detail = False`` to receive frames without chart series or the
    per-layer panel (cheaper to build).
    """

    def publish(self, frame: Frame) -> None: ...

    def close(self, frame: Frame) -> None: ...
