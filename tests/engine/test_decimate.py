"""Chart points (``_engine/decimate.py``): the extremes always kept, the indices as
``np.union1d`` would give them."""

from __future__ import annotations

import numpy as np
import pytest

from nbmonitor._engine import decimate as decimate_module
from nbmonitor._engine.decimate import decimate


@pytest.mark.parametrize("seed", range(20))
def test_extremes_are_merged_into_the_indices_as_union1d_does(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 50))
    idx = np.unique(rng.integers(0, 100, n)).astype(np.int64)
    if seed % 4 == 0:
        idx = idx[::-1].copy()  # not sorted: the general path
    if seed % 4 == 1 and idx.size > 1:
        idx = np.concatenate((idx, idx[:1]))  # a duplicate
    extra = (int(rng.integers(-5, 105)), int(rng.integers(-5, 105)))
    if seed % 5 == 0:
        extra = (extra[0], extra[0])
    got = decimate_module._with(idx, extra)
    expected = np.union1d(idx, extra)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_a_long_line_keeps_its_biggest_spike_and_its_lowest_point():
    x = np.arange(50_000, dtype=np.float64)
    y = np.sin(x / 500.0)
    y[12_345], y[40_001] = 50.0, -50.0
    xs, ys = decimate(x, y, 2000)
    assert xs.size <= 2002 and bool((np.diff(xs) > 0).all())
    assert 12_345.0 in xs and 40_001.0 in xs
    assert ys.max() == 50.0 and ys.min() == -50.0


@pytest.mark.parametrize(
    "x",
    [
        np.zeros(3000),  # one step's system samples
        np.r_[np.zeros(2999), 1.0],  # a long first step, then the next
        np.r_[0.0, np.ones(2999)],
        np.r_[np.zeros(2998), 1e-300, 1e-300],
        np.r_[-np.logspace(308, 0, 1500), np.logspace(0, 308, 1500)],
    ],
    ids=["constant", "long-first-step", "long-second-step", "tiny-span", "huge-span"],
)
def test_degenerate_x_is_decimated_without_a_panic(x):
    # tsdownsample binned these by x and panicked (a BaseException, past every guard).
    y = np.sin(np.arange(x.size) / 50.0)
    y[1234], y[2345] = 9.0, -9.0
    with np.errstate(all="raise"):
        xs, ys = decimate(x, y, 200)
    assert 0 < xs.size <= 202 and bool((xs[1:] >= xs[:-1]).all())
    assert ys.max() == 9.0 and ys.min() == -9.0
