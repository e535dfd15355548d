"""The memory panel's state: the device's memory series (CUDA, or the process's RSS) and the
headroom notes, only when they changed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from nbmonitor._engine.frame import Frame, Series
from nbmonitor.ui.panels import NAMES
from nbmonitor.ui.panels.memory import MemoryPanel


def frame(series: dict[str, Series], latest: dict[str, float]) -> Frame:
    return Frame(
        run="r", backend="cuda", status="running", step=3, total_steps=None, elapsed_s=1.0,
        eta_s=float("nan"), latest=latest, series=series,
    )  # fmt: skip


def test_cuda_series_and_headroom_notes() -> None:
    x = np.arange(3.0)
    series = {k: Series(x, x * 2**30) for k in ("cuda_allocated_bytes", "cuda_reserved_bytes")}
    series["process_rss_bytes"] = Series(x, x)
    latest = {"memory_peak_bytes": 6.0e10, "memory_limit_bytes": 8.0e10, "batch_size": 8.0,
              "batch_fits": 10.0, "batch_size_nan": float("nan")}  # fmt: skip
    panel = MemoryPanel()
    state = panel.state(frame(series, latest))
    assert state is not None
    assert set(state["series"]) == {"cuda_allocated_bytes", "cuda_reserved_bytes"}
    assert state["notes"] == {"memory_peak_bytes": 6.0e10, "memory_limit_bytes": 8.0e10,
                              "batch_size": 8.0, "batch_fits": 10.0}  # fmt: skip
    assert panel.state(frame(series, latest)) is None  # unchanged: nothing sent
    assert "memory" in NAMES


def test_on_the_cpu_the_process_rss() -> None:
    x = np.arange(3.0)
    state = MemoryPanel().state(frame({"process_rss_bytes": Series(x, x)}, {}))
    assert state is not None and set(state["series"]) == {"process_rss_bytes"}
    assert state["notes"] == {}


def test_the_breakdown_table_per_device_with_nan_as_null() -> None:
    from nbmonitor._engine.derive.memory_table import MemoryTable

    x = np.arange(3.0)
    row = {"device": "cuda:0", "parameters": 4.0, "buffers": 0.0, "gradients": 4.0,
           "optimizer_state": 8.0, "activations": 16.0, "measured": float("nan"),
           "measured_what": "", "other": float("nan")}  # fmt: skip
    base = frame({"process_rss_bytes": Series(x, x)}, {})
    with_table = replace(base, memory=MemoryTable(40, 30, (row,)))
    panel = MemoryPanel()
    state = panel.state(with_table)
    assert state is not None
    assert state["table"] == [{**row, "measured": None, "other": None}]
    assert (state["table_step"], state["activations_step"]) == (40, 30)
    assert panel.state(with_table) is None  # unchanged: nothing sent
    # A newer breakdown with the same curves is sent.
    newer = replace(base, memory=MemoryTable(50, 50, (row,)))
    assert (panel.state(newer) or {}).get("table_step") == 50


def test_the_cuda_allocator_settings_go_to_the_notes() -> None:
    x = np.arange(3.0)
    base = frame({"process_rss_bytes": Series(x, x)}, {})
    text = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    state = MemoryPanel().state(replace(base, allocator=text))
    assert state is not None and state["notes"] == {"allocator": text}
    assert (MemoryPanel().state(base) or {}).get("notes") == {}
