"""Alerts the layer flow raises from exact per-step facts (not window rules): gradients that
never arrived, the first parameters whose gradient norm is NaN/Inf, and a loop stopped by
``on_nan="raise"``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import CAUSE, FINDING, RuleDoc
from nbmonitor.health.wording import MAX_NAMED, label, name_list


def grads_never_arrived(
    names: Sequence[str],
    seen: npt.NDArray[np.bool_],
    *,
    step: int,
    time: float,
    at: int | None = None,
) -> Alert | None:
    """A ``gradient_not_flowing`` alert for the parameters whose gradient never arrived.

    ``seen[i]`` says whether ``names[i]`` (trainable, parameter order) ever had a gradient in
    the ``step`` steps so far; None when every one did. The alert is stamped at step ``at``
    (default ``step``).
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
        step if at is None else at,
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


def stopped(
    step: int,
    time: float,
    names: Sequence[str],
    *,
    forward: bool,
    kinds: Mapping[str, str] | None = None,
) -> Alert:
    """The ``stopped_non_finite`` alert: ``on_nan="raise"`` stopped the loop at ``step``, at the
    first non-finite gradient (``names``: the parameters) or module output (the module)."""
    if forward:
        what = f"the output of {label(names[0], kinds) if names else 'a module'} was NaN/Inf"
    else:
        what = f"the gradient of {name_list(names) or 'unknown'} was NaN/Inf"
    return Alert(
        "stopped_non_finite",
        "error",
        f"Training stopped by on_nan='raise' at step {step}: {what}; the optimizer step was "
        "not taken. Lower the learning rate, clip gradients, or check the inputs of that step.",
        step,
        time,
        tuple(names),
        subject=subjects.LAYERS if names else subjects.RUN,
    )


# This module's alerts in the table of causes (docs/diagnosis.md, benchmarks/diagnosis/table.py).
DOCS = {
    "gradient_not_flowing": RuleDoc(
        CAUSE,
        "a branch of the model gets no gradient: a `.detach()`, `.item()` or `torch.no_grad()` "
        "in forward, or a module the forward never uses",
        "trainable parameters whose gradient never arrived after 10 steps",
        "remove the detach from the forward, or the unused module from the model",
        ("frozen parameters", "a conv bias before BatchNorm (its gradient is zero, not missing)"),
    ),
    "stopped_non_finite": RuleDoc(
        FINDING,
        "`on_nan='raise'` stopped the loop at a non-finite gradient (or module output)",
        "the first parameters whose gradient was NaN/Inf, or with `check_forward=True` the "
        "first module whose output was",
        "find the overflow it names: lower the learning rate, clip, check the inputs",
    ),
}
