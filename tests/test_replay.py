"""Replay and live tail: a run on disk is drawn by the same FrameBuilder as a live one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import mlp, train, wait_for

import nbmonitor
from nbmonitor._engine.frame import Frame
from nbmonitor.replay import Follow, compare_series

ROOT = Path(__file__).resolve().parent.parent


def finished_run(
    tmp_path: Path, name: str = "replayed", lr: float = 0.01, steps: int = 40
) -> tuple[Frame, Path]:
    torch.manual_seed(0)
    model = mlp(width=8, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, name=name, display=False, interval=60)
    train(model, opt, mon, steps)
    mon.close()
    return mon.frame(), mon.run_dir


def test_a_replayed_run_shows_what_the_live_monitor_showed(tmp_path):
    live, path = finished_run(tmp_path)
    run = nbmonitor.open(path)
    replayed = run.frame()
    assert replayed.run == live.run and replayed.backend == live.backend
    assert replayed.step == live.step == 40 and replayed.status == "closed"
    for key in ("loss", "loss_smooth", "grad_norm", "lr", "step_time"):
        np.testing.assert_allclose(replayed.series[key].x, live.series[key].x)
        np.testing.assert_allclose(replayed.series[key].y, live.series[key].y, rtol=1e-9)
    assert replayed.latest["loss"] == pytest.approx(live.latest["loss"])
    assert replayed.latest["best_loss"] == pytest.approx(live.latest["best_loss"])
    assert [a.rule for a in replayed.alerts] == [a.rule for a in live.alerts]
    # the layer heatmap: the same layers, drawn from the per-layer rows of the run log
    assert replayed.layers is not None and live.layers is not None
    assert replayed.layers.names == live.layers.names
    assert replayed.layers.steps.size > 0
    assert np.isfinite(replayed.layers.log10_grad_norm).any()


def test_replay_dashboard_shows_the_final_frame(tmp_path):
    _, path = finished_run(tmp_path)
    dashboard = nbmonitor.open(path).dashboard()
    assert dashboard.last_frame.status == "closed" and dashboard.last_frame.step == 40
    assert "loss" in dashboard.last_frame.series


def test_replay_needs_no_torch(tmp_path):
    _, path = finished_run(tmp_path)
    stub = tmp_path / "stub" / "torch"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no torch here')\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(stub.parent)!r})
        import nbmonitor
        run = nbmonitor.open({str(path)!r})
        frame = run.frame()
        dashboard = run.dashboard()
        print(frame.step, len(frame.series["loss"].x), dashboard.last_frame.status)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["40", "40", "closed"]


WRITER = """
import os, sys, time, torch, nbmonitor
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
with nbmonitor.attach(model, opt, run_dir=sys.argv[1], name="writer", display=False,
                      interval=0.1) as mon:
    for step in range(30):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
        if step == 14:
            # Half-way, on disk, until the follower has seen it (whatever the machine's speed).
            mon.flush()
            deadline = time.monotonic() + 120
            while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
                time.sleep(0.02)
"""


class Spy:
    wants_detail = True

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.closed: Frame | None = None

    def publish(self, frame: Frame) -> None:
        self.frames.append(frame)

    def close(self, frame: Frame) -> None:
        self.closed = frame


def test_tail_follows_a_run_another_process_writes(tmp_path):
    go = tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(go)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        runs: list[Path] = []
        while not runs and time.monotonic() < deadline:
            runs = [p for p in tmp_path.glob("*-writer") if (p / "meta.json").exists()]
            time.sleep(0.05)
        assert runs, "the writer did not start"
        spy = Spy()
        follow = Follow(runs[0], [spy], interval=0.1)
        follow.start()
        assert wait_for(lambda: any(f.step >= 1 for f in spy.frames)), "nothing followed"
        go.touch()  # the writer goes on: the follower must see the rest
        deadline = time.monotonic() + 60
        while follow.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not follow.running, "the follower did not notice the run closing"
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    steps = [f.step for f in spy.frames]
    assert steps == sorted(steps) and any(1 <= s < 30 for s in steps)  # shown while it ran
    assert spy.closed is not None and spy.closed.status == "closed" and spy.closed.step == 30
    assert len(spy.closed.series["loss"].x) == 30


def test_compare_overlays_runs_and_lists_them(tmp_path):
    finished_run(tmp_path, "slow", lr=0.001, steps=20)
    finished_run(tmp_path, "fast", lr=0.05, steps=30)
    table = nbmonitor.list_runs(tmp_path)
    assert sorted(row["name"].split("-")[-1] for row in table) == ["fast", "slow"]
    lines = compare_series(tmp_path, "loss")
    assert sorted(len(s.x) for s in lines.values()) == [20, 30]
    figure = nbmonitor.compare(tmp_path, "loss")
    assert len(figure.marks) == 2
    with pytest.raises(ValueError, match="none of the runs has a 'nope' column"):
        nbmonitor.compare(tmp_path, "nope")


def test_follow_rejects_a_bad_interval(tmp_path):
    with pytest.raises(ValueError, match="interval must be > 0"):
        Follow(tmp_path, [], interval=0)


def test_the_replayed_layer_table_says_what_each_layer_is(tmp_path):
    live, path = finished_run(tmp_path)
    replayed = nbmonitor.open(path).frame()
    assert replayed.layers is not None and live.layers is not None
    live_rows = {r["name"]: r for r in live.layers.table}
    for row in replayed.layers.table:
        expected = live_rows[str(row["name"])]
        for key in ("shape", "numel", "dtype", "device", "in_optimizer"):
            assert row[key] == expected[key], (row["name"], key)
        # the run log keeps each layer's largest norm since its previous row (spikes survive),
        # so the table shows that rather than the very last step's
        assert row["grad_norm"] >= expected["grad_norm"] * (1 - 1e-9)
