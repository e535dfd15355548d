"""Alerts the layer flow raises from exact per-step facts (not window rules): gradients that
never arrived, and the first parameters whose gradient norm is NaN/Inf."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.wording import MAX_NAMED, name_list


def grads_never_arrived(
    names: Sequence[str], seen: npt.NDArray[np.bool_], *, step: int, time: float
) -> Alert | None:
    """A ``gradient_not_flowing`` alert for the parameters whose gradient never arrived.

    ``seen[i]`` says whether ``names[i]`` (trainable, parameter order) ever had a gradient in
    the ``step`` steps so far; None when every one did.
    """
    seen = np.asarray(seen, dtype=bool)
    if seen.shape != (len(names),):
        raise ValueError(
            f"grads_never_arrived: seen has shape {seen.shape}, expected ({len(names)},)."
        )
    missing = [names[int(i)] for i in np.flatnonzero(~seen)]
    if not missing:
        return None
    return Alert(
        "gradient_not_flowing",
        "warning",
        f"Parameters that never received a gradient after {step} steps: {name_list(missing)} "
        "(detached branch or unused module?). Check for .detach(), torch.no_grad() or .data "
        "in the forward pass, and modules that are defined but never called.",
        step,
        time,
        tuple(missing),
        subject=subjects.LAYERS,
    )


def first_non_finite(
    names: Sequence[str], norms: npt.NDArray[np.float64], limit: int = MAX_NAMED
) -> list[str]:
    """The first ``limit`` names (parameter order) whose value in ``norms`` is NaN or Inf."""
    values = np.asarray(norms, dtype=np.float64)
    if values.shape != (len(names),):
        raise ValueError(
            f"first_non_finite: norms has shape {values.shape}, expected ({len(names)},)."
        )
    return [names[int(i)] for i in np.flatnonzero(~np.isfinite(values))[:limit]]
