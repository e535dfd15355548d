"""Sparse keys: the store reads bit for bit as the dense store did (``dense_store.py``, the
store before sparse keys), whichever keys it holds sparsely and whenever they turn dense, and a
key costs memory in proportion to the values it holds."""

from __future__ import annotations

import math
import tracemalloc
import warnings
from typing import Any
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.engine.dense_store import DenseStore

from nbmonitor._engine import store as store_module
from nbmonitor._engine.store import Store

KEYS = ("a", "b", "c", "d", "e")
EDGE = (0.0, -0.0, 1.0, -1.0, 1e308, -1e308, math.inf, -math.inf, math.nan, 1e-300)
values = st.one_of(st.sampled_from(EDGE), st.floats(width=64))


def _same(a: Any, b: Any) -> None:
    """Equal bit for bit, but any NaN equals any NaN (a NaN's payload is not kept) and a zero
    either zero: the dense store's own sign of a bucket's min or max of 0.0 and -0.0 hung on
    where its column sat in memory (numpy's vector and scalar ``fmin`` differ on signed zeros)."""
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        assert (nan == np.isnan(b)).all(), (a, b)
        bits = ~nan & (a != 0)
        assert (a[~nan] == b[~nan]).all(), (a, b)
        assert (a[bits].view(np.int64) == b[bits].view(np.int64)).all(), (a, b)
    else:
        assert (a == b).all(), (a, b)


def _same_dict(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for key in a:
        _same(a[key], b[key])


def _compare(new: Store, old: DenseStore) -> None:
    assert len(new) == len(old)
    assert new.columns == old.columns
    assert new.bucket_width == old.bucket_width
    _same_dict(new.history(), old.history())
    names = list(old.columns)
    _same_dict(new.select(names[::-1]), old.select(names[::-1]))
    _same_dict(new.last_row(), old.last_row())
    for n in (0, 1, 3, 1000):
        _same_dict(new.tails([*names, "unknown"], n), old.tails([*names, "unknown"], n))
    for name in [*names, "unknown"]:
        assert math.isnan(new.last(name)) == math.isnan(old.last(name))
        if not math.isnan(old.last(name)):
            assert new.last(name) == old.last(name)
        _same(new.tail(name, 5), old.tail(name, 5))
        for x in ("step", "a"):
            # Points enough to keep every one: the store's part of a line, not tsdownsample's
            # (which panics on some lines these random columns make as x).
            # decimate() warns of overflow sorting an x of +-1e308, the same in both.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                nx, ny = new.series(name, 10_000, x=x)
                ox, oy = old.series(name, 10_000, x=x)
            _same(nx, ox)
            _same(ny, oy)
            if name in old.columns and x in old.columns:
                _same_dict(new.buckets(name, x), old.buckets(name, x))
        if name in old.columns:
            _same(new.column(name), old.column(name))


@st.composite
def row_batches(draw: st.DrawFn, start: int) -> list[dict[str, float]]:
    """A batch of rows: each key on each row with its own chance (0 = never, 1 = always)."""
    n = draw(st.integers(1, 80))
    chance = {key: draw(st.sampled_from((0.0, 0.05, 0.3, 1.0))) for key in KEYS}
    pick = draw(st.randoms(use_true_random=False))
    odd = (*EDGE, *draw(st.lists(values, max_size=3)))
    rows = []
    for i in range(n):
        row = {"step": float(start + i), "time": float(start + i) / 4}
        for key in KEYS:
            if pick.random() < chance[key]:
                row[key] = pick.choice(odd) if pick.random() < 0.2 else pick.uniform(-5, 5)
        rows.append(row)
    return rows


@st.composite
def column_batch(draw: st.DrawFn) -> dict[str, np.ndarray]:
    n = draw(st.integers(1, 40))
    keys = draw(st.lists(st.sampled_from(("step", "time", *KEYS)), min_size=1, unique=True))
    pick = draw(st.randoms(use_true_random=False))
    out = {}
    for key in keys:
        chance = draw(st.sampled_from((0.05, 0.5, 1.0)))
        col = np.array([pick.uniform(-5, 5) for _ in range(n)])
        col[[pick.random() >= chance for _ in range(n)]] = math.nan
        if n and draw(st.booleans()):
            col[0] = draw(values)
        out[key] = col
    return out


# When a key turns dense: (_MIN_DENSE, _DENSITY, _SPARSE_SHARE); the store's own (which turns
# every key dense at once in stores this small), never, on its first value, only when on every
# row since its first, only by bytes (once 20 times a small store's dense column).
MODES = ((16, 8, 2), (10**9, 8, 0), (1, 10**9, 0), (4, 1, 0), (10**9, 8, 0.05))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    recent=st.sampled_from((2, 4, 8, 16, 64)),
    buckets=st.sampled_from((2, 3, 4, 8)),
    mode=st.sampled_from(MODES[1:] * 3 + MODES[:1]),
    data=st.data(),
)
def test_reads_equal_the_dense_store(
    recent: int, buckets: int, mode: tuple[int, int, float], data: st.DataObject
) -> None:
    """Random mixes of dense and sparse keys, appended by rows (alike and mixed batches) and by
    columns, through folds and bucket merges, with the thresholds that make a key dense drawn
    too: every read equals the dense store's."""
    min_dense, density, share = mode
    with (
        mock.patch.object(store_module, "_MIN_DENSE", min_dense),
        mock.patch.object(store_module, "_DENSITY", density),
        mock.patch.object(store_module, "_SPARSE_SHARE", share),
    ):
        new, old = Store(recent, buckets), DenseStore(recent, buckets)
        _compare(new, old)
        for _ in range(data.draw(st.integers(1, 16))):
            if data.draw(st.integers(0, 3)) == 0:
                cols = data.draw(column_batch())
                new.extend_columns(cols)
                old.extend_columns(cols)
            else:
                rows = data.draw(row_batches(len(old)))
                if len(rows) == 1 and data.draw(st.booleans()):
                    new.append(rows[0])
                    old.append(rows[0])
                else:
                    new.extend(rows)
                    old.extend(rows)
            _compare(new, old)


def test_a_key_turns_dense_when_it_fills_its_rows() -> None:
    store = Store(recent=1024, buckets=64)
    store.extend([{"step": float(i), "time": 0.0, "loss": 1.0} for i in range(64)])
    assert "loss" in store._index and "loss" not in store._sparse
    store.extend([{"step": float(64 + i), "time": 0.0} for i in range(4096)])
    store.extend([{"step": 5000.0, "time": 0.0, "rare": 2.0}])
    assert "rare" in store._sparse
    _same(store.tail("rare", 2), np.array([math.nan, 2.0]))


def _sparse_run(store: Store | DenseStore, rows: int, keys: int, every: int) -> None:
    """``keys`` keys, key k logged on the steps where step % every == k % every, in ticks of
    100 rows as the sampler hands them."""
    names = [f"eval_{k}" for k in range(keys)]
    for start in range(0, rows, 100):
        batch = []
        for step in range(start, min(start + 100, rows)):
            row = {"step": float(step), "time": step * 0.01, "loss": 1.0 / (step + 1)}
            for k in range(step % every, keys, every):
                row[names[k]] = float(step)
            batch.append(row)
        store.extend(batch)


def test_sparse_keys_cost_memory_in_proportion_to_their_values() -> None:
    """256 keys each logged every 256th step over 70k steps (issue 37: +124 MB before, 317.8 MB
    for the dense store): the sparse keys hold at most 3 MiB above the same run without them
    (about 9 KiB a key),
    by the store's own count and by tracemalloc, and read what the dense store reads."""
    rows, keys, every = 70_000, 256, 256
    base = Store()
    _sparse_run(base, rows, 0, every)
    tracemalloc.start()
    try:
        store = Store()
        _sparse_run(store, rows, keys, every)
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    extra = store.nbytes - base.nbytes
    assert len(store.columns) == 3 + keys
    assert extra <= 3 << 20, extra
    assert held <= base.nbytes + (4 << 20), held
    old = DenseStore()
    _sparse_run(old, rows, keys, every)
    assert old.nbytes > 300 << 20
    names = list(old.columns)
    _same_dict(store.select(names), old.select(names))
    _same_dict(store.tails(names, 1000), old.tails(names, 1000))
    for name in ("eval_0", "eval_255", "loss"):
        _same_dict(store.buckets(name), old.buckets(name))


def test_a_dense_run_holds_what_it_held() -> None:
    """Keys logged on every row cost what the dense store's columns cost, no more, and stop
    growing once the tiers are full."""
    store, old = Store(), DenseStore()
    keys = [f"m{i}" for i in range(20)]
    sizes = []
    for start in range(0, 300_000, 10_000):
        batch = [
            {"step": float(s), "time": s * 0.01, **{k: float(s % 97) for k in keys}}
            for s in range(start, start + 10_000)
        ]
        store.extend(batch)
        old.extend(batch)
        assert store.nbytes == old.nbytes
        sizes.append(store.nbytes)
    assert sizes[-1] == sizes[-10]
    assert not store._sparse


def test_a_sparse_key_with_buckets_turns_dense_and_reads_the_same() -> None:
    """A key logged every 9th row through folds and merges, then on every row: it turns dense
    holding buckets, and reads as the dense store reads (a store this small would make it
    dense by bytes at once, so only the share of rows counts here)."""
    new, old = Store(recent=64, buckets=8), DenseStore(recent=64, buckets=8)
    with mock.patch.object(store_module, "_SPARSE_SHARE", 0):
        for step in range(1200):
            row = {"step": float(step), "time": step / 3}
            if step % 9 == 0 or step >= 900:
                row["k"] = math.sin(step)
            new.append(row)
            old.append(row)
            if step == 899:
                assert "k" in new._sparse and new._sparse["k"].nb > 0
    assert "k" in new._index
    _compare(new, old)
