"""The run model is the sinks' only ledger (``_engine/outbox.py``): every row it takes is in
its outbox once a reader opened it, each taken once, in order, bounded while nobody takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.outbox import Outbox
from nbmonitor._engine.run_model import RunModel
from nbmonitor.health.alert import Alert
from nbmonitor.memory import MemoryBreakdown


def steps(first: int, last: int) -> list[dict[str, float]]:
    return [{"step": float(s), "loss": 1.0 / s} for s in range(first, last + 1)]


def test_a_closed_outbox_keeps_nothing_and_an_open_one_hands_each_row_once() -> None:
    box = Outbox()
    box.put("steps", steps(1, 3))
    assert not box.take() and box.waiting("steps") == 0  # no reader yet: a replay's model
    box.open()
    box.open()  # idempotent: keeps what it has
    box.put("steps", steps(1, 3))
    box.put("steps", steps(4, 5))
    assert box.waiting("steps") == 5
    assert [r["step"] for r in box.take().streams["steps"]] == [1, 2, 3, 4, 5]
    assert not box.take()  # taken once
    box.put("steps", steps(6, 6))
    assert [r["step"] for r in box.take().streams["steps"]] == [6]


def test_the_streams_come_in_the_run_folders_order_whatever_order_they_were_taken_in() -> None:
    box = Outbox()
    box.open()
    for stream in ("memory", "spans", "layers", "events", "system", "steps"):
        box.put(stream, [{"step": 1.0}])
    box.put("system", [])
    assert list(box.take().streams) == ["steps", "system", "events", "layers", "spans", "memory"]


def test_past_its_bound_the_oldest_rows_are_dropped_and_counted() -> None:
    box = Outbox(limit=4)
    box.open()
    box.put("steps", steps(1, 3))
    box.put("steps", steps(4, 6))  # two too many
    box.put("system", [{"time": 1.0}])
    box.put("steps", steps(7, 7))  # one more
    assert box.take_dropped() == {"steps": 3}
    assert box.take_dropped() == {}  # said once
    batch = box.take()
    assert [r["step"] for r in batch.streams["steps"]] == [4, 5, 6, 7]  # the newest kept
    assert len(batch.streams["system"]) == 1
    with pytest.raises(ValueError, match="limit"):
        Outbox(limit=0)


def layers() -> LayerStats:
    infos = [ParamInfo(name, (2,), 2, "float32", "cpu", True, True) for name in "ab"]
    return LayerStats(infos, group_by="param")


def test_every_adder_of_the_run_model_puts_what_it_took_in_the_outbox() -> None:
    model = RunModel(layers())
    model.add_step_rows(steps(1, 1))  # before the reader opened it: not for the sinks
    model.outbox.open()
    capped = [{"step": 2.0}]
    model.add_step_rows(capped, logged=[{"step": 2.0, "rare_key": 5.0}])
    model.add_step_rows(steps(3, 4), {"step": [3.0, 4.0], "loss": [1 / 3, 1 / 4]})
    model.add_system_rows([{"time": 1.0, "step": 4.0, "cpu_percent": 50.0}])
    model.add_span_rows([{"name": "data", "step": 4, "start": 0.0, "end": 0.1}])
    alert = Alert("nan_loss", "error", "the loss is NaN", 4, 2.0)
    assert model.add_alerts([alert]) == [alert]
    breakdown = MemoryBreakdown((), step=4)
    model.add_memory([breakdown])
    model.add_layer_rows([{"step": 4.0, "grad_norm/a": 0.5, "grad_norm/b": 0.25}])
    batch = model.take_batch()
    got = batch.streams
    assert [r["step"] for r in got["steps"]] == [2.0, 3.0, 4.0]
    assert got["steps"][0] == {"step": 2.0, "rare_key": 5.0}  # every key logged
    assert model.steps.columns.count("rare_key") == 0  # the store kept the capped row
    assert got["system"] == [{"time": 1.0, "step": 4.0, "cpu_percent": 50.0}]
    assert got["spans"][0]["name"] == "data"
    assert got["events"] == [alert.to_record()]
    assert got["memory"] == [breakdown.to_record()]
    assert got["layers"] == [{"step": 4.0, "grad_norm/a": 0.5, "grad_norm/b": 0.25}]
    # The live layer rows are of values the layers already hold: they do not fill them again.
    assert model.layers is not None and model.layers.last_step == 0
    assert not model.layers.heatmap()[0].size
    assert not model.take_batch()


def test_columns_read_from_disk_reach_the_outbox_as_rows_when_it_is_open() -> None:
    model = RunModel()
    model.outbox.open()
    model.add_step_columns({"step": np.array([1.0, 2.0]), "loss": np.array([0.5, math.nan])})
    model.add_system_columns({"time": np.array([1.0]), "step": np.array([1.0])})
    model.add_layer_columns(
        {"step": np.array([2.0]), "grad_norm/a": np.array([0.5])},
        lambda names: LayerStats([ParamInfo(n, (), 1, "?", "?", True, True) for n in names]),
    )
    got = model.take_batch().streams
    assert got["steps"][0] == {"step": 1.0, "loss": 0.5}
    assert got["steps"][1]["step"] == 2.0 and math.isnan(got["steps"][1]["loss"])
    assert got["system"] == [{"time": 1.0, "step": 1.0}]
    assert got["layers"] == [{"step": 2.0, "grad_norm/a": 0.5}]


def test_layer_columns_fill_the_layers_through_the_model() -> None:
    """What replay reads of the layers stream: the peak gradient norms as heatmap columns, the
    newest finite parameter norm and update ratio per layer."""
    model = RunModel()
    made: list[list[str]] = []

    def new_layers(names: list[str]) -> LayerStats:
        made.append(list(names))
        return layers()

    model.add_layer_columns({"step": np.array([1.0])}, new_layers)  # names no layer yet
    assert model.layers is None and not made
    model.add_layer_columns(
        {
            "step": np.array([10.0, 20.0, 30.0]),
            "grad_norm/a": np.array([1.0, math.nan, 100.0]),
            "grad_norm/b": np.array([10.0, math.nan, math.nan]),
            "param_norm/a": np.array([3.0, 4.0, math.nan]),
            "update_ratio/b": np.array([1e-3, math.nan, math.nan]),
        },
        new_layers,
    )
    assert made == [["a", "b"]]
    stats = model.layers
    assert stats is not None
    heat_steps, heat = stats.heatmap()
    assert heat_steps.tolist() == [10.0, 30.0]  # the row without a finite norm left out
    np.testing.assert_allclose(heat, [[0.0, 2.0], [1.0, math.nan]], equal_nan=True)
    assert stats.param_norm.tolist()[0] == 4.0 and math.isnan(stats.param_norm[1])
    assert math.isnan(stats.update_ratio[0]) and stats.update_ratio[1] == 1e-3
    # Later columns of the same layers go on filling them; a layer not in the table is left out.
    model.add_layer_columns(
        {"step": np.array([40.0]), "grad_norm/a": np.array([1e-2]), "grad_norm/z": np.ones(1)},
        new_layers,
    )
    assert made == [["a", "b"]] and stats.heatmap()[0].tolist() == [10.0, 30.0, 40.0]
