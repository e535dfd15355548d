"""The diagnosis corpus of issue 42, held-back part: the same families as the tuning part
(tests/diagnosis/corpus) with other models, settings and variants of each bug. Written
without reading the rules, and not run while the rules are tuned: it measures how well they
generalise. ``BROKEN``, ``HEALTHY``; ``GPU_ONLY`` needs a CUDA device.
"""

from __future__ import annotations

from benchmarks.diagnosis.harness import Scenario
from tests.diagnosis.heldback import (
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
