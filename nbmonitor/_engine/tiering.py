"""The one bucket merge of the bounded tiers (the store's buckets, the layer heatmap): when a
tier is full, adjacent pairs of columns merge into one and the bucket width doubles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Merge = Callable[[npt.NDArray[Any], npt.NDArray[Any]], npt.NDArray[Any]]


def first(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The merge of a column that labels its bucket (its first step): the left one."""
    return a


def merge_pairs(arr: npt.NDArray[Any], used: int, op: Merge, fill: float) -> int:
    """Merge columns (2j, 2j+1) of ``arr[..., :used]`` into column j with ``op`` (an odd last
    column moves down alone), fill the freed columns with ``fill``; the new count of columns.

    ``op`` must keep what the tier promises: ``np.fmin``/``np.fmax`` for extremes (NaN only
    where both are), ``np.add`` for NaN-free sums and counts, so means stay count-weighted.
    """
    k, odd = used // 2, used % 2
    with np.errstate(invalid="ignore", over="ignore"):
        merged = op(arr[..., 0 : 2 * k : 2], arr[..., 1 : 2 * k : 2])
    tail = arr[..., used - 1].copy() if odd else None
    arr[..., :k] = merged
    if tail is not None:
        arr[..., k] = tail
    arr[..., k + odd :] = fill
    return k + odd
