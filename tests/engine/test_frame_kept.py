"""The frame's parts are kept from one build to the next and made again only when what they
are made from changed: a frame built so is the frame built from scratch, input after input."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._engine.frame import MAX_POINTS, Frame, FrameState, RunInfo
from nbmonitor._engine.frame_builder import FrameBuilder
from nbmonitor._engine.run_model import RunModel
from nbmonitor.health.alert import Alert
from nbmonitor.memory import MemoryBreakdown, MemoryRow
from nbmonitor.records import PHASE_KEYS

INFO = RunInfo("run", "cpu", 5000)


def equal(a: Any, b: Any, where: str = "frame") -> None:
    """Field by field, arrays by value (NaN equal to NaN), with where they differ."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            equal(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for k in a:
            equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            equal(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, (where, a, b)


def step_rows(first: int, n: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(first, first + n):
        row = {
            "step": float(step),
            "time": 100.0 + 0.01 * step,
            "loss": float(rng.lognormal(0, 1)),
            "lr": 1e-3,
            "grad_norm": float(rng.lognormal(0, 1)),
            "step_time": float(rng.uniform(0.005, 0.02)),
            "samples": 8.0,
            "micro_batches": 1.0,
        }
        row.update(
            zip(PHASE_KEYS, rng.uniform(0.001, 0.004, len(PHASE_KEYS)).tolist(), strict=True)
        )
        rows.append(row)
    return rows


def system_row(step: int, rss: float) -> dict[str, float]:
    return {
        "step": float(step),
        "time": 100.0 + 0.01 * step,
        "cpu_percent": 50.0 + step % 7,
        "process_cpu_percent": 90.0,
        "ram_used_bytes": 8e9,
        "ram_total_bytes": 16e9,
        "process_rss_bytes": rss,
    }


def memory(step: int, activations: int) -> MemoryBreakdown:
    rows = (
        MemoryRow("parameters", "0", "float32", "cpu", 4096, 2),
        MemoryRow("gradients", "0", "float32", "cpu", 4096, 2),
        MemoryRow("activations", "0", "float32", "cpu", activations, 3),
    )
    return MemoryBreakdown(rows, step=step, activations_step=step)


def model_with_layers() -> RunModel:
    params = [ParamInfo(f"{i}.weight", (4, 4), 16, "float32", "cpu", True, True) for i in range(3)]
    return RunModel(LayerStats(params))


def test_a_frame_built_again_is_the_frame_built_from_scratch_after_every_change():
    model = model_with_layers()
    builder = FrameBuilder(INFO, model)

    def state(step: int, open_rows: tuple[dict[str, float], ...] = ()) -> FrameState:
        return FrameState("running", step, 1.0, open_rows=open_rows)

    def check(now: FrameState) -> Frame:
        frame = builder.build(now)
        equal(frame, FrameBuilder(INFO, model).build(now))
        return frame

    check(state(0))  # nothing yet
    model.add_step_rows(step_rows(1, 40, seed=1))
    model.add_system_rows([system_row(40, 1e9)])
    check(state(40))
    model.add_step_rows(step_rows(41, 40, seed=2))  # new steps only
    check(state(80))
    model.add_system_rows([system_row(80, 2e9)])  # a new system sample only
    check(state(80))
    model.add_memory([memory(80, 1 << 20)])
    check(state(80))
    model.add_memory([memory(90, 1 << 21)])  # a breakdown replaced by another
    check(state(90))
    model.add_span_rows([{"name": "data", "step": 90, "start": 100.9, "dur": 0.002}])
    check(state(90))
    opened = ({"step": 91.0, "step_time": 0.5, "loss": 3.0},)
    check(state(91, opened))  # a row still open: its step time is part of the run's
    model.add_alerts([Alert("exploding_gradients", "warning", "m", 90, 0.0, ("1.weight",))])
    check(state(91, opened))
    assert model.layers is not None
    model.layers.add_grad_norm_rows([91, 92], np.full((2, 3), 2.0), None)
    check(state(92))
    # Past the points a chart line gets: decimated the same, kept or not.
    model.add_step_rows(step_rows(93, MAX_POINTS + 500, seed=3))
    check(state(MAX_POINTS + 600))


def test_parts_whose_inputs_did_not_change_are_not_made_again():
    """Counted, not timed: a frame of an unchanged run makes no part; a new system sample
    makes only the parts read from the system samples."""
    model = model_with_layers()
    model.add_step_rows(step_rows(1, 60, seed=4))
    model.add_system_rows([system_row(60, 1e9)])
    model.add_memory([memory(60, 1 << 20)])
    builder = FrameBuilder(INFO, model)
    now = FrameState("running", 60, 1.0)
    first = builder.build(now)
    made = builder.parts_made
    again = builder.build(now)
    assert builder.parts_made == made
    assert all(again.series[k] is first.series[k] for k in first.series)
    assert again.timeline is first.timeline and again.memory is first.memory
    model.add_system_rows([system_row(61, 2e9)])
    after = builder.build(now)
    system_lines = {"cpu_percent", "process_cpu_percent", "ram_used_bytes", "process_rss_bytes"}
    # the system's lines, the memory table and the derived figures (headroom reads both)
    assert builder.parts_made == made + len(system_lines) + 2
    assert {k for k in first.series if after.series[k] is not first.series[k]} == system_lines
    assert after.timeline is first.timeline
    assert after.latest["memory_peak_bytes"] == 2e9
