"""The diagnosis corpus of issue 42, tuning part: broken runs (one classic bug each, with its
public source and the signal that makes naming it fair) and healthy runs of varied kinds.

``BROKEN``, ``HEALTHY``: CPU runs; ``GPU_ONLY``: broken runs that need a CUDA device.
"""

from __future__ import annotations

from benchmarks.diagnosis.harness import Scenario
from tests.diagnosis.corpus import (
    finetune,
    flow,
    healthy,
    inputs,
    loss,
    mode,
    optimizer,
    precision,
    regularisation,
    schedule,
)

BROKEN: tuple[Scenario, ...] = (
    *optimizer.BROKEN,
    *schedule.BROKEN,
    *loss.BROKEN,
    *inputs.BROKEN,
    *mode.BROKEN,
    *precision.BROKEN,
    *regularisation.BROKEN,
    *finetune.BROKEN,
    *flow.BROKEN,
)
GPU_ONLY: tuple[Scenario, ...] = precision.GPU_ONLY
HEALTHY: tuple[Scenario, ...] = healthy.HEALTHY

__all__ = ["BROKEN", "GPU_ONLY", "HEALTHY"]
