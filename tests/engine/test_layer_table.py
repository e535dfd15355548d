"""The layer table (``LayerStats.table``, ``mon.layers()`` and the dashboard's table): built
again only when what it shows changed, and then equal to a table built from scratch."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbmonitor._engine.assemble import layers as layers_module
from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo, module_of
from nbmonitor._engine.run_model import RunModel
from nbmonitor.health.alert import Alert


def params() -> list[ParamInfo]:
    return [
        ParamInfo("0.weight", (4, 3), 12, "float32", "cpu", True, True),
        ParamInfo("0.bias", (4,), 4, "float32", "cpu", True, False),
        ParamInfo("2.weight", (1, 4), 4, "float16", "cuda:0", False, True),
        ParamInfo("head", (2,), 2, "float32", "cpu", True, True),
    ]


def from_scratch(stats: LayerStats, flags: dict[str, list[str]]) -> list[dict[str, object]]:
    """The table as it is defined: every field read again from the parameters and the live
    numbers (what the table was before it was kept between calls)."""
    key = module_of if stats.group_by == "module" else (lambda n: n)
    rows: list[dict[str, object]] = []
    for i, name in enumerate(stats.names):
        members = [p for p in stats.params if key(p.name) == name]
        first = members[0]
        rows.append(
            {
                "name": name,
                "shape": first.shape if len(members) == 1 else f"{len(members)} tensors",
                "numel": sum(p.numel for p in members),
                "dtype": first.dtype,
                "device": first.device,
                "requires_grad": any(p.requires_grad for p in members),
                "in_optimizer": all(p.in_optimizer for p in members),
                "grad_norm": float(stats.latest_grad[i]),
                "param_norm": float(stats.param_norm[i]),
                "update_ratio": float(stats.update_ratio[i]),
                "flags": sorted(set(flags.get(name, []))),
            }
        )
    return rows


def same(a: list[dict[str, object]], b: list[dict[str, object]]) -> bool:
    """Equal row by row, key order included, NaN equal to NaN."""

    def norm(v: object) -> object:
        return "nan" if isinstance(v, float) and math.isnan(v) else v

    return [[(k, norm(v)) for k, v in r.items()] for r in a] == [
        [(k, norm(v)) for k, v in r.items()] for r in b
    ]


@pytest.mark.parametrize("group_by", ["param", "module"])
def test_the_table_follows_every_change_of_its_input(group_by):
    stats = LayerStats(params(), group_by=group_by)
    n = len(stats.params)
    flags: dict[str, list[str]] = {}

    def check() -> list[dict[str, object]]:
        first = stats.table(flags)
        assert same(first, from_scratch(stats, flags))
        again = stats.table(flags)  # nothing changed: the same rows
        assert all(a is b for a, b in zip(first, again, strict=True))
        return first

    before = check()  # NaN everywhere
    stats.add_grad_norm_rows([1, 2], np.arange(2.0 * n).reshape(2, n) + 1, None)
    after = check()
    assert all(a is not b for a, b in zip(before, after, strict=True))
    stats.set_param_norms([3.0] * n)
    check()
    stats.add_update([2.0] * n + [0.5] * n, step=2)
    check()
    flags[stats.names[0]] = ["exploding_gradients", "gradient_spike", "exploding_gradients"]
    check()
    flags[stats.names[-1]] = ["vanishing_gradients"]
    check()
    stats.param_norm[0] = 7.0  # written in place, as a run read from disk does
    check()
    stats.update_ratio[-1] = math.inf
    check()
    stats.add_grad_norms(3, np.full(n, math.nan), None)
    check()


def published(model: RunModel) -> list[dict[str, object]]:
    """The rows of the table the pipeline publishes (what ``mon.layers()`` returns)."""
    table = model.layer_table()
    assert table is not None
    return table.rows()


def test_a_flag_added_to_a_layer_already_flagged_is_in_the_next_table():
    model = RunModel(LayerStats(params()))
    assert all(row["flags"] == [] for row in published(model))
    alert = Alert("exploding_gradients", "warning", "m", 5, 0.0, ("0.weight",))
    model.add_alerts([alert])
    assert published(model)[0]["flags"] == ["exploding_gradients"]
    model.add_alerts([Alert("gradient_spike", "warning", "m", 6, 0.0, ("0.weight",))])
    assert published(model)[0]["flags"] == ["exploding_gradients", "gradient_spike"]
    # A rule that keeps naming a layer is kept once: the flags stay bounded all run long.
    model.add_alerts([alert] * 50)
    assert model.layer_flags["0.weight"] == ["exploding_gradients", "gradient_spike"]
    assert model.layers is not None
    expected = from_scratch(model.layers, model.layer_flags)
    assert same(published(model), expected)
    assert same(model.layers.table(model.layer_flags), expected)


def test_a_published_table_stays_as_it_was_when_the_layers_move_on():
    stats = LayerStats(params())
    n = len(stats.params)
    flags = {"head": ["vanishing_gradients"]}
    stats.add_grad_norm_rows([1], np.full((1, n), 2.0), None)
    table = stats.snapshot(flags)
    then = from_scratch(stats, flags)
    stats.add_grad_norm_rows([2], np.full((1, n), 3.0), None)
    stats.param_norm[:] = 9.0
    flags["head"].append("exploding_gradients")
    assert same(table.rows(), then)
    assert same(stats.snapshot(flags).rows(), from_scratch(stats, flags))


def test_a_tick_builds_the_fixed_part_of_no_row(monkeypatch):
    """What the parameters fix is built once, at construction: a table a tick, of hundreds of
    layers, builds only the rows whose live numbers changed (counted, not timed)."""
    built: list[str] = []
    real = layers_module._static_row

    def counted(name: str, members: list[ParamInfo]) -> dict[str, object]:
        built.append(name)
        return real(name, members)

    monkeypatch.setattr(layers_module, "_static_row", counted)
    stats = LayerStats(params())
    assert built == list(stats.names)
    n = len(stats.params)
    for step in range(1, 20):
        stats.add_grad_norm_rows([step], np.full((1, n), float(step)), None)
        stats.table()
        stats.frame()
    assert built == list(stats.names)
    assert [row["grad_norm"] for row in stats.table()] == [19.0] * n


def heat_one_column_at_a_time(stats: LayerStats, steps: np.ndarray, logs: np.ndarray) -> None:
    """The heatmap's merge written column by column (what ``_add_heat`` did before it
    filled the columns of a tick at once): the reference it must equal."""
    r, k = 0, len(steps)
    while r < k:
        if stats._in_bucket == 0:
            if stats._heat_used == stats._columns:
                stats._merge_pairs()
            take = min(stats._width, k - r)
            col = stats._heat_used
            stats._heat[:, col] = np.fmax.reduce(logs[r : r + take], axis=0)
            stats._heat_steps[col] = steps[r]
            stats._heat_used += 1
        else:
            take = min(stats._width - stats._in_bucket, k - r)
            col = stats._heat_used - 1
            chunk = np.fmax.reduce(logs[r : r + take], axis=0)
            stats._heat[:, col] = np.fmax(stats._heat[:, col], chunk)
        stats._in_bucket = (stats._in_bucket + take) % stats._width
        r += take


@pytest.mark.parametrize("seed", range(6))
def test_the_heatmap_filled_a_tick_at_a_time_is_the_one_filled_column_by_column(seed):
    rng = np.random.default_rng(seed)
    n = 3
    infos = [ParamInfo(f"p{i}", (2,), 2, "float32", "cpu", True, True) for i in range(n)]
    fast, slow = LayerStats(infos, columns=8), LayerStats(infos, columns=8)
    step = 0
    for _ in range(40):
        k = int(rng.integers(1, 30))
        norms = rng.lognormal(0, 2, (k, n))
        norms[rng.random((k, n)) < 0.1] = np.nan
        steps = np.arange(step + 1, step + k + 1, dtype=np.float64)
        step += k
        fast.add_grad_norm_rows(steps.astype(int).tolist(), norms, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log10(norms)
        logs[~np.isfinite(logs)] = np.nan
        heat_one_column_at_a_time(slow, steps, logs)
        for a, b in zip(fast.heatmap(), slow.heatmap(), strict=True):
            np.testing.assert_array_equal(a, b)
        assert (fast._width, fast._in_bucket) == (slow._width, slow._in_bucket)
