"""mon.log() refuses keys nbmonitor measures; many distinct sparse keys cost bounded memory."""

from __future__ import annotations

import tracemalloc

import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._engine.column_cap import MAX_COLUMNS, ColumnCap
from nbmonitor._engine.store import Store

MEASURED = [
    "step",
    "time",
    "step_time",
    "samples",
    "samples_per_s",
    "micro_batches",
    "grad_norm",
    "lr",
    "lr_group1",
    "lr_group12",
    "loss_smooth",
]


@pytest.mark.parametrize("key", MEASURED)
def test_a_measured_key_is_refused_at_the_call_with_what_to_do(tmp_path, key):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        with pytest.raises(TypeError) as info:
            mon.log(loss=1.0, **{key: 3.0})
        message = str(info.value)
        assert "\n" not in message
        assert f"log({key}=...)" in message and f"my_{key}=" in message
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        mon.log(**{f"my_{key}": 3.0})
        assert mon.flush()
        h = mon.history()
    assert h[f"my_{key}"].tolist() == [3.0]
    if key == "lr":
        assert h["lr"].tolist() == [0.01]  # the measurement stands


def test_1000_sparse_keys_logged_once_each_cost_bounded_memory(tmp_path):
    rows = [{"step": float(i), "time": float(i), "loss": 1.0, f"k{i}": 2.0} for i in range(1000)]
    cap = ColumnCap()
    tracemalloc.start()
    try:
        store = Store(recent=4096, buckets=1024)
        base = tracemalloc.get_traced_memory()[0]
        for start in range(0, 20_000, 500):
            chunk = rows[start : start + 500] or [
                {"step": float(i), "time": 0.0, "loss": 1.0} for i in range(start, start + 500)
            ]
            store.extend(cap.filter(chunk))
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(store.columns) == MAX_COLUMNS
    # MAX_COLUMNS columns of (4096 recent + 4 x 1024 bucket) values: ~8 MiB. Uncapped, 1,003
    # columns would take ~64 MiB.
    per_column = (4096 + 4 * 1024) * 8
    assert used < 1.6 * MAX_COLUMNS * per_column
    assert cap.first_refused == f"k{MAX_COLUMNS - 3}"


def test_keys_past_the_cap_are_on_disk_and_said_once(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = MAX_COLUMNS + 20
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for i in range(n):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            mon.log(loss=1.0, **{f"val_{i}": float(i)})
        assert mon.flush()
        live = mon.history()
        notices = [a for a in mon.events() if a.rule == "columns_capped"]
    assert len(live) == MAX_COLUMNS
    assert len(notices) == 1 and "kept on disk only" in notices[0].message
    assert live["loss"].tolist() == [1.0] * n  # the rows themselves are all there
    on_disk = nbmonitor.open(mon.run_dir).history()
    assert on_disk[f"val_{n - 1}"][-1] == float(n - 1)
