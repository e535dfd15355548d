"""The dashboard's steering, joined to the run: the two plain callables ``ui/`` is given.

``ui/`` never reaches the training thread's package: the live entrance hands the dashboard a
``ui.steer_controls.SteerHooks`` whose ``request`` queues on the run's ``Steering`` (applied by
the training thread at the next step boundary) and whose ``state`` reads it. Once the
dashboard's widget exists, ``DashboardSteering.route`` makes its steering messages reach a
kernel busy running the loop in the cell (``busy_kernel.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

from nbmonitor.live.busy_kernel import SteeringRoute, route_steering
from nbmonitor.ui.steer_controls import SteerHooks, SteerState

SOURCE = "dashboard"


class SteeringLike(Protocol):
    """What of ``_capture.steer.Steering`` the dashboard uses."""

    @property
    def paused(self) -> bool: ...

    @property
    def stop_requested(self) -> bool: ...

    @property
    def last_step(self) -> int: ...

    def request(
        self,
        kind: str,
        value: float | None = None,
        *,
        source: str = "python",
        at_step: int | None = None,
    ) -> None: ...


class DashboardSteering:
    """One dashboard's link to the run's steering."""

    def __init__(self, steering: SteeringLike) -> None:
        self._steering = steering
        self._route: SteeringRoute | None = None
        self.hooks = SteerHooks(request=self._request, state=self._state)

    @property
    def routed(self) -> bool:
        """Whether the steering messages bypass a busy main thread (ipykernel 7's subshells)."""
        return self._route is not None

    def route(self, widget: Any) -> None:
        """Route the widget's steering messages past a busy main thread, where the kernel can."""
        comm = getattr(widget, "comm", None)
        if comm is not None:
            self._route = route_steering(comm)

    def _request(self, kind: str, value: float | None) -> None:
        try:
            self._steering.request(kind, value, source=SOURCE)
        finally:
            if self._route is not None:
                self._route.restore_parent()

    def _state(self) -> SteerState:
        steering = self._steering
        return SteerState(
            paused=bool(steering.paused),
            stopping=bool(steering.stop_requested),
            step=int(steering.last_step),
        )
