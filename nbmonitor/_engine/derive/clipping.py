"""How much the gradient clip acts: the share of recent steps it scaled (``grad_clip_coef``
below 1) and the coefficient of the latest step with one, from the steps store."""

from __future__ import annotations

import numpy as np

from nbmonitor._engine.store import Store

WINDOW = 100


def clip_share(steps: Store) -> dict[str, float]:
    """``grad_clipped_fraction`` over the last ~100 steps that have a clip coefficient (a loop
    that clips with a number ``max_norm``); {} when none has."""
    coef = steps.tail("grad_clip_coef", WINDOW)
    coef = coef[np.isfinite(coef)]
    if not coef.size:
        return {}
    return {"grad_clipped_fraction": float(np.count_nonzero(coef < 1.0) / coef.size)}
