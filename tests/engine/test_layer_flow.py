"""LayerFlow: finite gradient norms wait (bounded) for a reader and reach the layer statistics
in step order; a non-finite step takes the waiting ones first and is reported once."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from nbmonitor._engine.assemble import layer_flow
from nbmonitor._engine.assemble.layer_flow import LayerFlow
from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.assemble.step_norms import LayerNorms
from nbmonitor._engine.frame import Alert
from nbmonitor.records import AuxRecord

NAMES = ["0.weight", "0.bias", "1.weight"]


def flow() -> tuple[LayerFlow, LayerStats, list[Alert]]:
    params = [ParamInfo(n, (2,), 2, "float32", "cpu", True, True) for n in NAMES]
    layers = LayerStats(params, group_by="param")
    alerts: list[Alert] = []

    def report(step, time, bad, forward, checked):  # type: ignore[no-untyped-def]
        return Alert("grad_non_finite", "error", f"bad at {step}", step, time, tuple(bad))

    return (
        LayerFlow(layers, alerts.extend, report, forward_checked=False, clock=lambda: 1.0),
        (layers),
        alerts,
    )


def block(steps: list[int], bad: dict[int, int] | None = None) -> LayerNorms:
    norms = np.arange(1.0, 1.0 + len(steps) * len(NAMES)).reshape(len(steps), len(NAMES))
    for row, col in (bad or {}).items():
        norms[row, col] = math.nan
    return LayerNorms(tuple(steps), norms, None, np.all(np.isfinite(norms), axis=1))


def test_finite_norms_wait_for_a_reader_then_arrive_in_step_order() -> None:
    f, layers, alerts = flow()
    f.add([block([1, 2, 3])], [], step=3)
    assert layers.recent()[0].tolist() == []  # waiting, not lost
    assert f.waiting_values == 3 * len(NAMES)
    # a later tick with a NaN step takes the waiting ones first: the window stays in order
    f.add([block([4], bad={0: 2})], [], step=4)
    steps, norms = layers.recent()
    assert f.waiting_values == 0
    assert steps.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert math.isnan(norms[2, 3]) and np.all(np.isfinite(norms[:, :3]))
    assert [a.layers for a in alerts] == [("1.weight",)]


def test_a_non_finite_episode_is_reported_once_and_again_after_recovery() -> None:
    f, _, alerts = flow()
    f.add([block([1, 2], bad={0: 0, 1: 0})], [], step=2)
    assert len(alerts) == 1
    f.add([block([3])], [], step=3)
    f.take_waiting()  # finite steps end the episode once they reach the statistics
    f.add([block([4], bad={0: 1})], [], step=4)
    assert [a.step for a in alerts] == [1, 4]


def test_waiting_norms_are_bounded_without_a_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layer_flow, "LAYER_DEFER_MAX_VALUES", 10)
    f, layers, _ = flow()
    for step in range(1, 6):
        f.add([block([step])], [], step=step)
        assert f.waiting_values < 10
    # taken in bounded batches with no reader at all: at most three steps still wait
    assert layers.recent()[0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_gradients_that_never_arrived_are_reported_after_ten_steps() -> None:
    f, _, alerts = flow()
    seen_some = LayerNorms((1,), np.array([[1.0, 2.0]]), (0, 1), np.array([True]))
    f.add([seen_some], [], step=9)
    assert alerts == []
    f.add([], [], step=10)
    assert [a.rule for a in alerts] == ["gradient_not_flowing"]
    assert alerts[0].layers == ("1.weight",)


def test_finite_rows_between_other_records_wait_as_one_slice_in_step_order() -> None:
    f, layers, alerts = flow()
    forward = AuxRecord(3, "forward", (), None)  # type: ignore[arg-type]  # value is not read here
    f.add([block([1, 2, 3, 4, 5, 6, 7, 8], bad={4: 1})], [(forward, [])], step=8)
    # steps 1-2 were taken before the forward check of step 3, 3-4 before the NaN of step 5;
    # 6-8 wait as one slice of their block, not one object per row
    assert [b.steps for b in f._deferred] == [(6, 7, 8)]
    f.take_waiting()
    steps, norms = layers.recent()
    assert steps.tolist() == [float(s) for s in range(1, 9)]
    expected = np.arange(1.0, 1.0 + 8 * len(NAMES)).reshape(8, len(NAMES))
    expected[4, 1] = math.nan
    np.testing.assert_array_equal(norms, expected.T)
    assert [a.step for a in alerts] == [5]


@pytest.mark.parametrize("seed", range(30))
def test_blocks_cut_where_other_records_fall_give_what_row_by_row_gives(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rising blocks are cut only where a forward check or a non-finite step falls between
    # their rows (_in_order_cut); row by row (blocks that do not rise) gives the same.
    rng = np.random.default_rng(seed)
    blocks, step = [], 0
    for _ in range(int(rng.integers(1, 5))):
        n = int(rng.integers(1, 12))
        steps = list(range(step + 1, step + 1 + n))
        step += n + int(rng.integers(0, 3))
        bad = {
            int(r): int(rng.integers(len(NAMES)))
            for r in rng.integers(0, n, 2)
            if rng.random() < 0.3
        }
        blocks.append(block(steps, bad))
    updates = sorted(int(s) for s in rng.integers(1, step + 2, int(rng.integers(1, 6))))
    aux = [
        (AuxRecord(s, "update", (), None), [float(s)] * (2 * len(NAMES)))  # type: ignore[arg-type]
        if rng.random() < 0.5
        else (AuxRecord(s, "forward", (), None), [])  # type: ignore[arg-type]
        for s in updates
    ]

    def run() -> tuple[object, ...]:
        f, layers, alerts = flow()
        calls: list[tuple[str, object]] = []  # what reaches the statistics, in order
        for name in ("add_grad_norm_rows", "add_grad_norms", "add_update", "add_forward"):
            method = getattr(layers, name)

            def logged(*args: Any, _name: str = name, _method: Any = method) -> Any:
                calls.append((_name, repr(args)))
                return _method(*args)

            setattr(layers, name, logged)
        f.add(blocks, aux, step=step)
        waiting = [(b.steps, b.norms.tolist()) for b in f._deferred]
        f.take_waiting()
        steps, norms = layers.recent()
        return (calls, waiting, steps.tolist(), repr(norms.tolist()), [a.step for a in alerts],
                f.take_rows(), repr(layers.update_ratio.tolist()))  # fmt: skip

    cut = run()
    monkeypatch.setattr(layer_flow, "_rising", lambda blocks: False)
    assert cut == run()


def test_update_ratios_do_not_cut_the_waiting_rows() -> None:
    # A sampled step's update ratios (every layer_every steps) touch nothing the gradient
    # norms do: a tick's finite rows still reach the statistics in one pass.
    f, layers, _ = flow()
    calls: list[str] = []
    for name in ("add_grad_norm_rows", "add_update"):
        method = getattr(layers, name)

        def logged(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls.append(_name)
            return _method(*args)

        setattr(layers, name, logged)
    updates = [
        (AuxRecord(s, "update", (), None), [float(s)] * (2 * len(NAMES)))  # type: ignore[arg-type]
        for s in (3, 6, 9)
    ]
    f.add([block(list(range(1, 10)))], updates, step=9)  # (the no-gradient check at 10 reads)
    assert calls == ["add_update"] * 3 and f.waiting_values == 9 * len(NAMES)
    rows = f.take_rows()
    assert [r["step"] for r in rows] == [3.0, 6.0, 9.0]
    assert layers.update_ratio.tolist() == [1.0] * len(NAMES)
    f.take_waiting()
    assert calls == ["add_update"] * 3 + ["add_grad_norm_rows"]
    assert layers.recent()[0].tolist() == [float(s) for s in range(1, 10)]
