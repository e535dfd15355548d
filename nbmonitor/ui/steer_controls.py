"""The dashboard's steering controls: what the buttons send, and what the bar says.

The front end (``js/src/steer.js``) sends one custom widget message per click,
``{"type": "steer", "kind": "pause" | "resume" | "stop" | "checkpoint" | "lr", "value": ...}``;
``read_request`` checks it (it comes from the browser: anything else is ignored) and the
dashboard hands it to ``SteerHooks.request``, a plain callable the live entrance gives (``ui/``
never reaches the training thread). The bar's state (``steer`` trait) is read from
``SteerHooks.state`` at each publish: "running", "paused" (at step N), "stopping", "stopped".

Where the message arrives while a cell is busy running the training loop is the live entrance's
business (``live/busy_kernel.py``): this module only says which messages are steering
(``is_steer_message``), so that they can be routed past the busy main thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

KINDS = ("pause", "resume", "stop", "checkpoint", "lr")


class SteerState(NamedTuple):
    """What the run's steering says now (read from any thread)."""

    paused: bool
    stopping: bool
    step: int  # the last step boundary the training thread reached


@dataclass(frozen=True)
class SteerHooks:
    """The two plain callables a steerable dashboard is given by the live entrance."""

    request: Callable[[str, float | None], None]
    state: Callable[[], SteerState]


def is_steer_message(data: object) -> bool:
    """Whether a comm message's ``data`` (ipywidgets' ``{"method": "custom", "content": ...}``)
    is a steering request: cheap, never raises (it runs on the kernel's shell channel thread)."""
    if not isinstance(data, dict) or data.get("method") != "custom":
        return False
    content = data.get("content")
    return isinstance(content, dict) and content.get("type") == "steer"


def read_request(content: object) -> tuple[str, float | None] | None:
    """``(kind, value)`` of a well-formed steering message, else None (ignored): an unknown
    kind, an lr that is not a finite positive number."""
    if not isinstance(content, Mapping) or content.get("type") != "steer":
        return None
    kind = content.get("kind")
    if kind not in KINDS:
        return None
    if kind != "lr":
        return str(kind), None
    value = content.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        lr = float(value)
    except ValueError:
        return None
    if not math.isfinite(lr) or lr <= 0:
        return None
    return "lr", lr


def bar_state(state: SteerState | None, status: str) -> dict[str, Any]:
    """The ``steer`` trait: whether the controls show, and what the run is doing.

    ``status`` is the frame's: once the run closed after a stop it reads "stopped"."""
    if state is None:
        return {"enabled": False, "state": "", "step": None}
    if status in ("closed", "stopped"):
        said = "stopped" if state.stopping or status == "stopped" else "closed"
        return {"enabled": False, "state": said, "step": state.step}
    said = "stopping" if state.stopping else "paused" if state.paused else "running"
    return {"enabled": True, "state": said, "step": state.step}
