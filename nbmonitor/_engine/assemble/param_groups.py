"""Param groups added to the optimizer mid-run (``optimizer.add_param_group``): what is measured
of them, said once as an info alert."""

from __future__ import annotations

from nbmonitor.health.alert import Alert


def groups_added_notes(
    added: list[tuple[int, float, tuple[tuple[int, int, int], ...]]],
) -> list[Alert]:
    """An info alert per param group added to the optimizer mid-run: what is measured of it."""
    alerts = []
    for step, time_, groups in added:
        for index, n, outside in groups:
            lr = "lr" if index == 0 else f"lr_group{index}"
            message = (
                f"Param group {index} was added to the optimizer at step {step}; its learning "
                f"rate is recorded as {lr}. "
                + (
                    f"{outside} of its {n} parameters are not in the attached model: their "
                    "gradients are not measured. "
                    if outside
                    else ""
                )
                + "Update ratios cover only the parameters the optimizer held at attach."
            )
            alerts.append(Alert("param_group_added", "info", message, step, time_))
    return alerts
