"""A run's frame is the same live and read back from its folder: the live pipeline and the
replay fill the one run model (``_engine/run_model.py``), and the one FrameBuilder reads it.

Compared field by field, series point by point, energy included; the layer heatmap from
disk is the live one at the run log's resolution (``same_heatmap``). Left out, each for its
reason: ``elapsed_s`` (live, the monitor's own clock since attach; from disk, the time
between the first and the last step written), ``errors`` (what failed in this process is not
a fact of the run), ``devices`` (the accelerators' gauges now; a run on disk has none) and
``notes`` (why MFU is missing: the live FLOPs counter's word, not written to disk).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
import nbmonitor.backends.selection as selection
from nbmonitor._engine.frame import Frame, LayerFrame
from nbmonitor.backends.cpu import CpuBackend
from nbmonitor.replay import Follow, Job
from nbmonitor.runs.format import STREAMS

NOT_OF_THE_RUN = {"elapsed_s", "errors", "devices", "notes"}


class EnergyBackend(CpuBackend):
    """The CPU backend with a training device (index 0) whose energy counter grows 7 J a
    sample: energy per step and per sample are then known, live and from disk."""

    def __init__(self) -> None:
        super().__init__()
        self.device_index = 0
        self._joules = itertools.count(100.0, 7.0)

    @property
    def keys(self) -> tuple[str, ...]:
        return (*super().keys, "gpu0_energy_j")

    def sample(self) -> dict[str, float]:
        return {**super().sample(), "gpu0_energy_j": next(self._joules)}


@pytest.fixture
def energy_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(selection, "select", lambda model, backend="auto": EnergyBackend())


def same(live: Any, disk: Any, where: str) -> None:
    """``live`` equals ``disk``, recursively; NaN equals NaN, floats to JSON's round trip."""
    if dataclasses.is_dataclass(live) and not isinstance(live, type):
        assert type(live) is type(disk), where
        for f in dataclasses.fields(live):
            same(getattr(live, f.name), getattr(disk, f.name), f"{where}.{f.name}")
    elif isinstance(live, dict):
        assert isinstance(disk, dict) and set(live) == set(disk), (
            where,
            sorted(set(live) ^ set(disk)),
        )
        for key in live:
            same(live[key], disk[key], f"{where}[{key!r}]")
    elif isinstance(live, (list, tuple)):
        assert isinstance(disk, (list, tuple)) and len(live) == len(disk), where
        for i, (a, b) in enumerate(zip(live, disk, strict=True)):
            same(a, b, f"{where}[{i}]")
    elif isinstance(live, np.ndarray):
        np.testing.assert_allclose(live, disk, rtol=1e-12, atol=0, equal_nan=True, err_msg=where)
    elif isinstance(live, float) and isinstance(disk, (int, float)):
        assert (math.isnan(live) and math.isnan(disk)) or live == pytest.approx(disk, rel=1e-12), (
            where
        )
    else:
        assert live == disk, where


def same_heatmap(live: LayerFrame, disk: LayerFrame) -> None:
    """The run log keeps, per layer, the largest gradient norm since its previous layer row
    (one row per health check: every step of every layer would be most of the log), so the
    heatmap from disk has a column at each such step holding the peak of the live columns
    since the one before."""
    assert disk.names == live.names and disk.steps.size
    assert np.isin(disk.steps, live.steps).all()
    previous = -math.inf
    for j, step in enumerate(disk.steps):
        since = (live.steps > previous) & (live.steps <= step)
        with np.errstate(all="ignore"):
            peak = np.fmax.reduce(live.log10_grad_norm[:, since], axis=1)
        np.testing.assert_allclose(disk.log10_grad_norm[:, j], peak, rtol=1e-12, equal_nan=True)
        previous = step
    # The table's grad_norm column likewise: from disk, the peak of the last layer row.
    last = disk.log10_grad_norm[:, -1]
    for i, (a, b) in enumerate(zip(live.table, disk.table, strict=True)):
        same({k: v for k, v in a.items() if k != "grad_norm"},
             {k: v for k, v in b.items() if k != "grad_norm"}, f"layers.table[{i}]")  # fmt: skip
        assert math.log10(float(b["grad_norm"])) == pytest.approx(last[i], rel=1e-12)


def assert_same_frame(live: Frame, disk: Frame) -> None:
    for f in dataclasses.fields(Frame):
        if f.name in NOT_OF_THE_RUN:
            continue
        if f.name == "layers" and live.layers is not None and disk.layers is not None:
            same_heatmap(live.layers, disk.layers)
        else:
            same(getattr(live, f.name), getattr(disk, f.name), f.name)


def run_and_compare(mon: Any, body: Any) -> tuple[Frame, Frame]:
    try:
        body()
    finally:
        mon.close()
    live = mon.frame()
    disk = nbmonitor.open(mon.run_dir).frame()
    return live, disk


def test_a_plain_run_is_the_same_live_and_from_disk(
    tmp_path: pathlib.Path, energy_backend: None
) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, total_steps=40,
                           interval=0.05)  # fmt: skip

    def body() -> None:
        for _ in range(4):
            train(model, opt, mon, steps=10, batch=5)
            mon.flush()  # system samples between the steps: energy per step is known

    live, disk = run_and_compare(mon, body)
    assert live.status == "closed" and live.step == 40
    assert live.latest["energy_per_step_j"] > 0 and live.latest["energy_per_sample_j"] > 0
    assert math.isfinite(live.latest["best_loss"])
    assert live.layers is not None and live.layers.names  # the layer panel is compared too
    assert_same_frame(live, disk)


def test_a_run_with_spans_phases_and_clipping_is_the_same_live_and_from_disk(
    tmp_path: pathlib.Path, energy_backend: None
) -> None:
    torch.manual_seed(1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05,
                           phases=True)  # fmt: skip

    def body() -> None:
        for step in range(30):
            with mon.span("data"):
                x, y = torch.randn(4, 8), torch.randn(4, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05 if step % 2 else 100.0)
            opt.step()
            mon.log(loss=loss)
            if step % 10 == 9:
                with mon.span("eval"):
                    mon.flush()

    live, disk = run_and_compare(mon, body)
    assert live.timeline is not None and live.timeline.gantt and live.timeline.summary
    assert {r["name"] for r in live.timeline.summary} >= {"data", "eval", "forward"}
    assert 0 < live.latest["grad_clipped_fraction"] < 1
    assert_same_frame(live, disk)


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    for key in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
        monkeypatch.delenv(key, raising=False)
    env = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": 2, "NBMONITOR_JOB_ID": "j"}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))


class Spy:
    wants_detail = True

    def __init__(self) -> None:
        self.frames: list[Any] = []

    def publish(self, frame: Any) -> None:
        self.frames.append(frame)

    def close(self, frame: Any) -> None:
        self.frames.append(frame)


def test_a_two_rank_job_is_the_same_live_and_from_its_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, energy_backend: None
) -> None:
    lives: dict[int, Frame] = {}
    job_dir = None
    for rank in (1, 0):  # the display rank last: it writes the cross-rank summary at close
        as_rank(monkeypatch, rank)
        torch.manual_seed(rank)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
        try:
            for _ in range(3):
                train(model, opt, mon, steps=8)
                mon.flush()
        finally:
            mon.close()
        lives[rank] = mon.frame()
        job_dir = mon.job_dir
    assert job_dir is not None
    job = nbmonitor.open(job_dir)
    assert isinstance(job, Job) and sorted(job.ranks) == [0, 1]
    for rank, live in lives.items():
        assert live.step == 24 and "energy_per_step_j" in live.latest
        assert_same_frame(live, job.ranks[rank].frame())
    # The cross-rank frame: followed record by record as the folder grew, and read whole.
    spy = Spy()
    follower = Follow(job_dir, [spy], interval=1.0, job=True)
    assert follower.refresh()  # every rank has closed
    same(spy.frames[-1], job.frame(), "ranks")


class RecordingSink:
    """A sink that keeps what it is given."""

    name = "recording"

    def __init__(self) -> None:
        self.rows: dict[str, list[Any]] = {}
        self.flushes = 0
        self.closed: Any = None

    def write(self, batch: Any) -> None:
        for stream, rows in batch.streams.items():
            self.rows.setdefault(stream, []).extend(rows)

    def flush(self) -> None:
        self.flushes += 1

    def close(self, final_meta: Any) -> None:
        self.closed = final_meta


def test_a_sink_is_fed_the_same_rows_live_and_from_disk(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(2)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    live = RecordingSink()
    # The live pipeline's sinks: the run log, and whatever joins it (exporters).
    sinks = mon.internals.sinks
    sinks.sinks.append(live)
    sinks.guards.append(type(sinks.guards[0])("sink:recording", mon.errors_log))
    try:
        with mon.span("work"):
            train(model, opt, mon, steps=6)
            mon.flush()  # system samples between the steps
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=math.nan)  # an alert: events too
            train(model, opt, mon, steps=5)
    finally:
        mon.close()
    # Every stream the run model takes (its outbox) reached the sink.
    assert live.rows.keys() == set(STREAMS), sorted(live.rows)
    disk = RecordingSink()
    run = nbmonitor.open(mon.run_dir)
    run.feed(disk, rows_per_batch=5)
    assert disk.flushes >= 3 and disk.closed["status"] == "closed"
    assert len(disk.rows["steps"]) == 12 and disk.rows.keys() == live.rows.keys()
    for stream, rows in live.rows.items():
        same(rows, disk.rows[stream], stream)
    with pytest.raises(ValueError, match="rows_per_batch"):
        run.feed(disk, rows_per_batch=0)


def test_non_finite_values_read_back_as_they_were_logged(tmp_path: pathlib.Path) -> None:
    """±Infinity and NaN are data (a diverged loss, an overflowed gradient norm): what
    ``mon.history()`` holds live is what the run folder gives back, bit for bit, through the
    sidecar and through the text alone; a key logged at a few steps only (NaN where it was not
    logged) keeps its Infinity apart from its missing steps; and the frames agree."""
    import shutil

    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    values = [1.0, math.inf, -math.inf, math.nan, 2.0, 0.5, 1e308, math.inf]

    def body() -> None:
        for i, value in enumerate(values):
            train(model, opt, mon, steps=1)
            mon.log(score=value)
            if i in (1, 6):
                mon.log(rare=-math.inf if i == 1 else math.inf)

    live, disk = run_and_compare(mon, body)
    assert_same_frame(live, disk)
    assert any((pathlib.Path(mon.run_dir) / "columns" / "steps").iterdir())  # read from chunks
    text_only = tmp_path / "text-only"
    shutil.copytree(mon.run_dir, text_only)
    shutil.rmtree(text_only / "columns")
    history = mon.history()
    want = np.array(values)
    assert history["score"].tobytes() == want.tobytes()
    rare = np.full(len(values), np.nan)
    rare[[1, 6]] = [-math.inf, math.inf]
    assert history["rare"].tobytes() == rare.tobytes()
    for where in (mon.run_dir, text_only):
        read = nbmonitor.open(where).history()
        for key in ("step", "score", "rare"):
            assert read[key].tobytes() == history[key].tobytes(), (where, key)
