"""The per-tensor squared norms read from a step's raw float32 values (``records._tail_squares``)
are those float32 arithmetic gives, bit for bit, whatever the values' range: the squares are
made in float64 and rounded (a subnormal float32 square is slow to compute, not different)."""

from __future__ import annotations

import numpy as np
import pytest

from nbmonitor.records import NormLayout, squared_norms, squared_norms_split


def float32_reference(tail: np.ndarray, layout: NormLayout) -> np.ndarray:
    """What the read was before: squares in float32, sums in float64."""
    cut = layout.norms
    parts = [np.square(tail[..., :cut], dtype=np.float64)]
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        squares = np.square(tail[..., cut:])
    parts.append(np.add.reduceat(squares, layout.offsets, axis=-1, dtype=np.float64))
    return np.concatenate(parts, axis=-1)


def values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    # Magnitudes from far below float32's normal range once squared (1e-30: a deep layer's
    # gradients) to beyond its largest once squared (1e25), zeros, both signs, NaN and Inf.
    magnitude = 10.0 ** rng.uniform(-45, 25, size=shape)
    out: np.ndarray = (magnitude * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)
    flat = out.reshape(-1)
    picks = rng.choice(flat.size, size=max(1, flat.size // 50), replace=False)
    flat[picks[0::4]] = 0.0
    flat[picks[1::4]] = np.nan
    flat[picks[2::4]] = np.inf
    flat[picks[3::4]] = np.float32(1e-40)  # a subnormal value itself
    return out


@pytest.mark.parametrize("rows", [None, 1, 37])
def test_squares_equal_float32_arithmetic_bit_for_bit(rows: int | None) -> None:
    rng = np.random.default_rng(7)
    lengths = [64, 1, 3000, 17, 64, 9000, 5]
    starts = tuple(int(s) for s in np.cumsum([0, *lengths[:-1]]))
    layout = NormLayout(squared=2, norms=3, starts=starts)
    width = layout.norms + sum(lengths)
    shape = (width,) if rows is None else (rows, width)
    head = np.abs(values(rng, (*shape[:-1], 2))).astype(np.float64)
    tail = values(rng, shape)
    got = squared_norms_split(head, tail, layout)
    want = np.concatenate([head, float32_reference(tail, layout)], axis=-1)
    assert got.dtype == np.float64 and got.shape == want.shape
    # NaN as NaN, and every other value the same bits
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.int64), want[finite].view(np.int64))
    # and through the packed form too (head and tail in one float32 row)
    packed = np.concatenate([head.astype(np.float32), tail], axis=-1)
    again = squared_norms(packed, layout)
    ref = np.concatenate([packed[..., :2].astype(np.float64), float32_reference(tail, layout)], -1)
    assert np.array_equal(np.isnan(again), np.isnan(ref))
    assert np.array_equal(again[~np.isnan(ref)].view(np.int64), ref[~np.isnan(ref)].view(np.int64))


def test_float64_values_are_squared_in_float64() -> None:
    rng = np.random.default_rng(3)
    layout = NormLayout(squared=0, norms=1, starts=(0, 4))
    tail = rng.standard_normal((5, 9))
    got = squared_norms_split(np.empty((5, 0)), tail, layout)
    want = np.concatenate(
        [np.square(tail[:, :1]), np.add.reduceat(np.square(tail[:, 1:]), [0, 4], axis=-1)], -1
    )
    assert np.array_equal(got, want)
