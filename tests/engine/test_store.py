"""The bounded store: dynamic columns, two tiers, bounded memory, spike-keeping decimation."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from nbmonitor._engine.store import Store

METRICS = [f"m{i}" for i in range(20)]


def _rows(start: int, n: int, metrics: list[str], seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed + start)
    vals = rng.random((n, len(metrics))).tolist()
    return [
        {
            "step": float(start + k),
            "time": float(start + k) / 10,
            **dict(zip(metrics, v, strict=True)),
        }
        for k, v in enumerate(vals)
    ]


def _fill(store: Store, total: int, metrics: list[str], chunk: int = 50_000) -> None:
    for start in range(len(store), total, chunk):
        store.extend(_rows(start, min(chunk, total - start), metrics))


def test_columns_are_dynamic_and_missing_values_are_nan() -> None:
    s = Store(recent=16, buckets=4)
    s.append({"step": 0.0, "time": 0.0, "loss": 1.0})
    s.append({"time": 0.1, "step": 1.0})  # loss missing
    s.append({"step": 2.0, "time": 0.2, "lr": 0.5, "loss": 0.5})
    assert s.columns == ("step", "time", "loss", "lr")
    h = s.history()
    np.testing.assert_array_equal(h["step"], [0, 1, 2])
    np.testing.assert_array_equal(h["loss"], [1.0, np.nan, 0.5])
    np.testing.assert_array_equal(h["lr"], [np.nan, np.nan, 0.5])
    assert all(v.dtype == np.float64 for v in h.values())


def test_step_and_time_come_first_even_if_a_metric_is_seen_first() -> None:
    s = Store()
    s.append({"loss": 1.0, "step": 0.0, "time": 0.0})
    assert s.columns[:2] == ("step", "time")
    assert len(s) == 1
    assert Store().columns == ("step", "time")


def test_late_column_is_nan_in_earlier_rows_and_in_old_buckets() -> None:
    s = Store(recent=64, buckets=8)
    _fill(s, 5000, ["a"], chunk=700)
    s.extend([{"step": 5000.0 + k, "time": 0.0, "a": 0.0, "late": 7.0} for k in range(10)])
    h = s.history()
    lengths = {len(v) for v in h.values()}
    assert len(lengths) == 1
    late = h["late"]
    assert np.isnan(late[:-10]).all()
    np.testing.assert_array_equal(late[-10:], 7.0)
    b = s.buckets("late")
    assert np.isnan(b["min"]).all() and np.isnan(b["mean"]).all()


def test_many_columns_grow_by_reallocation_without_losing_data() -> None:
    s = Store(recent=32, buckets=8)
    for i in range(100):
        s.append({"step": float(i), "time": 0.0, f"k{i}": float(i)})
    assert len(s.columns) == 102
    assert s.last("k0") == 0.0
    assert s.last("k99") == 99.0
    h = s.history()
    assert {len(v) for v in h.values()} == {len(h["step"])}
    assert np.nanmax(h["k99"]) == 99.0


def test_last_is_newest_written_value_even_between_logs_and_nonfinite() -> None:
    s = Store()
    assert math.isnan(s.last("loss"))
    s.append({"step": 0.0, "time": 0.0, "loss": 2.0})
    s.append({"step": 1.0, "time": 0.1})
    assert s.last("loss") == 2.0
    s.append({"step": 2.0, "time": 0.2, "loss": math.inf})
    assert s.last("loss") == math.inf
    s.extend(
        [{"step": 3.0, "time": 0.3, "loss": 1.0}, {"step": 4.0, "time": 0.4, "loss": math.nan}]
    )
    assert math.isnan(s.last("loss"))
    assert s.last("step") == 4.0


def test_last_row_is_the_newest_row_with_nan_for_absent_keys() -> None:
    s = Store()
    assert s.last_row() == {}
    s.append({"step": 0.0, "time": 0.0, "loss": 2.0})
    s.append({"step": 1.0, "time": 0.5, "lr": 0.1})
    row = s.last_row()
    assert row["step"] == 1.0 and row["time"] == 0.5 and row["lr"] == 0.1
    assert math.isnan(row["loss"])


def test_tail_returns_full_resolution_recent_values() -> None:
    s = Store(recent=100, buckets=8)
    s.extend([{"step": float(i), "time": 0.0, "x": float(i)} for i in range(1000)])
    np.testing.assert_array_equal(s.tail("x", 5), [995, 996, 997, 998, 999])
    # Bounded by what the recent tier holds, never bucket means.
    t = s.tail("x", 10_000)
    assert 50 <= len(t) <= 100
    np.testing.assert_array_equal(t, np.arange(1000 - len(t), 1000))
    assert s.tail("nope", 5).size == 0
    assert s.tail("x", 0).size == 0


@pytest.mark.parametrize("n", [0, 1, 5, 100, 10_000])
def test_tails_are_the_tail_of_each_known_column(n: int) -> None:
    s = Store(recent=100, buckets=8)
    s.extend([{"step": float(i), "time": 0.0, "x": float(i), "y": -float(i)} for i in range(1000)])
    got = s.tails(["y", "nope", "x", "step"], n)
    assert list(got) == ["y", "x", "step"]
    for name, values in got.items():
        np.testing.assert_array_equal(values, s.tail(name, n))
    got["x"][:] = -1.0  # copies: the store keeps its values
    np.testing.assert_array_equal(s.tail("x", 1), [999.0])


def test_select_is_column_of_each_name() -> None:
    s = Store(recent=64, buckets=8)
    _fill(s, 3000, ["a", "b"], chunk=999)  # folded: bucket means, then the recent rows
    got = s.select(["b", "step", "a"])
    assert list(got) == ["b", "step", "a"]
    for name, values in got.items():
        np.testing.assert_array_equal(values, s.column(name))
    with pytest.raises(KeyError):
        s.select(["a", "missing"])


def test_column_matches_history_and_unknown_raises() -> None:
    s = Store(recent=64, buckets=8)
    _fill(s, 3000, ["a", "b"], chunk=999)
    h = s.history()
    for name in s.columns:
        np.testing.assert_array_equal(s.column(name), h[name])
    with pytest.raises(KeyError):
        s.column("missing")


def test_history_is_bucket_means_then_recent_rows() -> None:
    s = Store(recent=8, buckets=4)
    s.extend([{"step": float(i), "time": 0.0, "v": float(i)} for i in range(13)])
    # Two folds of 4 rows; the second needs 8 buckets of width 1, so pairs merge first:
    # buckets cover [0,1], [2,3], [4,5], [6,7] and rows 8..12 stay at full resolution.
    h = s.history()
    assert s.bucket_width == 2
    np.testing.assert_array_equal(h["v"][:4], [0.5, 2.5, 4.5, 6.5])
    np.testing.assert_array_equal(h["v"][4:], np.arange(8, 13))
    np.testing.assert_array_equal(h["step"], h["v"])


@pytest.mark.parametrize(("recent", "buckets", "n"), [(16, 4, 1000), (7, 5, 999), (9, 3, 5000)])
def test_bucket_stats_are_nan_aware_and_exact_after_merges(
    recent: int, buckets: int, n: int
) -> None:
    s = Store(recent=recent, buckets=buckets)
    v = np.arange(n, dtype=np.float64)
    v[::3] = np.nan  # NaN is data: skipped by min/max/mean, not poisoning them
    s.extend([{"step": float(i), "time": 0.0, "v": float(v[i])} for i in range(n)])
    b = s.buckets("v")
    w = s.bucket_width
    assert 0 < len(b["x"]) <= buckets
    for j in range(len(b["x"])):
        rows = slice(j * w, j * w + int(b["rows"][j]))
        assert b["min"][j] == np.nanmin(v[rows])
        assert b["max"][j] == np.nanmax(v[rows])
        assert b["mean"][j] == pytest.approx(np.nanmean(v[rows]), rel=1e-12)
        assert b["x"][j] == pytest.approx(np.mean(np.arange(n)[rows]), rel=1e-12)
    assert int(b["rows"].sum()) + len(s.tail("v", 10**9)) == n


def test_all_nan_bucket_reads_nan() -> None:
    s = Store(recent=4, buckets=4)
    s.extend([{"step": float(i), "time": 0.0, "v": math.nan} for i in range(20)])
    b = s.buckets("v")
    assert len(b["x"]) > 0
    assert np.isnan(b["min"]).all() and np.isnan(b["max"]).all() and np.isnan(b["mean"]).all()


def test_memory_is_bounded_and_flat_for_a_million_rows() -> None:
    s = Store()
    bound = 64 * 1024 * 1024
    # One prebuilt chunk reused keeps the test fast; the store copies values, so reuse is safe
    # (steps repeat, which the memory bound does not care about).
    chunk = _rows(0, 50_000, METRICS)
    sizes = []
    for _ in range(22):
        s.extend(chunk)
        sizes.append(s.nbytes)
    assert len(s) == 1_100_000
    assert max(sizes) < bound
    # Flat once the bucket tier exists (the first fold happens inside the second chunk).
    assert len(set(sizes[2:])) == 1
    h = s.history()
    assert len(h) == 22
    assert {len(v) for v in h.values()} == {len(h["step"])}
    assert len(h["step"]) <= 65_536 + 16_384


def test_a_single_spike_in_a_million_rows_survives_decimation() -> None:
    s = Store()
    n, spike_at, spike = 1_000_000, 123_457, 1_000.0
    chunk = 100_000
    for start in range(0, n, chunk):
        y = np.sin(np.arange(start, start + chunk) / 5_000.0)
        if start <= spike_at < start + chunk:
            y[spike_at - start] = spike
        s.extend([{"step": float(start + k), "time": 0.0, "loss": v} for k, v in enumerate(y)])
    # The spike sits in the bucket tier, so it can only survive through the bucket max.
    assert s.tail("loss", 10**9).size < n - spike_at
    b = s.buckets("loss")
    assert b["max"].max() == spike
    x, y = s.series("loss", max_points=2000)
    assert len(x) <= 2002
    assert y.max() == spike
    assert abs(x[int(np.argmax(y))] - spike_at) <= s.bucket_width
    assert x.dtype == np.float64 and y.dtype == np.float64
    assert (np.diff(x) >= 0).all()


def test_series_drops_nonfinite_points_and_keeps_short_series_whole() -> None:
    s = Store()
    vals = [1.0, math.nan, 3.0, math.inf, -math.inf, 6.0]
    s.extend([{"step": float(i), "time": 0.0, "v": v} for i, v in enumerate(vals)])
    x, y = s.series("v")
    np.testing.assert_array_equal(x, [0, 2, 5])
    np.testing.assert_array_equal(y, [1, 3, 6])
    ex, ey = s.series("unknown")
    assert ex.size == 0 and ey.size == 0


def test_series_against_time_and_unsorted_x() -> None:
    s = Store()
    # A restarted step counter: x goes back; series still hands the downsampler sorted x.
    steps = list(range(3000)) + list(range(3000))
    s.extend([{"step": float(k), "time": float(i), "v": float(i)} for i, k in enumerate(steps)])
    x, y = s.series("v", max_points=500)
    assert len(x) <= 502
    assert (np.diff(x) >= 0).all()
    assert y.max() == 5999.0
    xt, _ = s.series("v", max_points=500, x="time")
    assert (np.diff(xt) > 0).all()
    with pytest.raises(ValueError):
        s.series("v", max_points=2)


def test_extend_matches_append_one_by_one() -> None:
    rows = _rows(0, 3000, ["a", "b"])
    rows[10] = {"step": 10.0, "time": 1.0, "b": 2.0, "c": 5.0}  # a mixed batch
    one, many = Store(recent=128, buckets=8), Store(recent=128, buckets=8)
    for r in rows:
        one.append(r)
    many.extend(rows)
    assert one.columns == many.columns
    h1, h2 = one.history(), many.history()
    for k in h1:
        np.testing.assert_array_equal(h1[k], h2[k])
    assert len(one) == len(many) == 3000


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        Store(recent=1)
    with pytest.raises(ValueError):
        Store(buckets=1)


def test_concurrent_writer_and_reader() -> None:
    s = Store(recent=256, buckets=16)
    errors: list[BaseException] = []
    total = 20_000

    def writer() -> None:
        try:
            for start in range(0, total, 100):
                s.extend(_rows(start, 100, ["a", "b"]))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=writer, name="test-store-writer")
    t.start()
    reads = 0
    while t.is_alive() or reads == 0:
        h = s.history()
        assert len({len(v) for v in h.values()}) == 1
        x, y = s.series("a", max_points=100)
        assert len(x) == len(y)
        s.tail("a", 10)
        s.last_row()
        reads += 1
    t.join()
    assert not errors
    assert len(s) == total
    assert s.last("step") == total - 1


def test_extend_columns_matches_extend_rows() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    cols = {"step": np.arange(1.0, n + 1), "loss": rng.random(n), "lr": rng.random(n)}
    cols["loss"][::7] = np.nan
    by_rows, by_cols = Store(recent=256, buckets=64), Store(recent=256, buckets=64)
    by_rows.extend([{k: float(v[i]) for k, v in cols.items()} for i in range(n)])
    by_cols.extend_columns(cols)
    assert len(by_rows) == len(by_cols) == n
    h1, h2 = by_rows.history(), by_cols.history()
    for key in cols:
        np.testing.assert_array_equal(h1[key], h2[key])
    assert by_rows.last_row()["lr"] == by_cols.last_row()["lr"]
    with pytest.raises(ValueError, match="different lengths"):
        by_cols.extend_columns({"step": np.arange(3.0), "loss": np.arange(2.0)})
