"""Which implementation an optimizer's step runs, read once when the optimizer becomes the
monitor's: the time rules suggest a fused or foreach optimizer only to a run that does not
already use one (``health/rules/time.py``).

torch's optimizers say it in their defaults: ``fused``/``foreach`` True when asked for, None
for torch's choice (foreach on the devices with foreach kernels, unless ``differentiable``), and
no such key when the class has no such implementation. Anything else (another library's
optimizer) is "unknown": nothing is suggested to it.
"""

from __future__ import annotations

import torch

from nbmonitor.records import OptimizerRecord

# torch's own lists, read once (private helpers: a fallback if they move).
try:
    from torch.utils._foreach_utils import (
        _get_foreach_kernels_supported_devices,
        _get_fused_kernels_supported_devices,
    )

    FOREACH_DEVICES = frozenset(_get_foreach_kernels_supported_devices())
    FUSED_DEVICES = frozenset(_get_fused_kernels_supported_devices())
except Exception:  # pragma: no cover - depends on torch's private layout
    FOREACH_DEVICES = frozenset({"cuda", "xpu"})
    FUSED_DEVICES = frozenset({"cpu", "cuda", "mps", "xpu"})


def _device(optimizer: torch.optim.Optimizer) -> str:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return str(p.device.type)
    return "cpu"


def describe(optimizer: torch.optim.Optimizer, step: int) -> OptimizerRecord:
    """The ``OptimizerRecord`` of ``optimizer``: its defaults and one parameter's device, no
    device work."""
    defaults = optimizer.defaults
    device = _device(optimizer)
    differentiable = bool(defaults.get("differentiable", False))
    fused, foreach = defaults.get("fused"), defaults.get("foreach")
    if "foreach" not in defaults and "fused" not in defaults:
        implementation = "unknown"
    elif fused:
        implementation = "fused"
    elif foreach or (foreach is None and not differentiable and device in FOREACH_DEVICES):
        implementation = "foreach"
    else:
        implementation = "for-loop"
    return OptimizerRecord(
        step=step,
        name=type(optimizer).__name__,
        device=device,
        implementation=implementation,
        can_fuse="fused" in defaults and device in FUSED_DEVICES and not differentiable,
        can_foreach="foreach" in defaults and not differentiable,
    )


__all__ = ["describe"]
