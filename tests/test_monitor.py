"""The engine end to end: attach, record, tick, close, re-attach, bad input."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import HFStyle, hook_counts, mlp, train, wait_for

import nbmonitor
from nbmonitor._engine.assemble.layers import LayerStats
from nbmonitor._engine.pipeline import Pipeline
from nbmonitor.health import Health
from nbmonitor.live.monitor import Monitor


@pytest.fixture
def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return mlp()


def attach(
    model: torch.nn.Module, opt: torch.optim.Optimizer | None, tmp_path: Path, **kw: object
) -> Monitor:
    kw.setdefault("display", False)
    kw.setdefault("interval", 60.0)  # tests drive tick() themselves
    return nbmonitor.attach(model, opt, run_dir=tmp_path, **kw)  # type: ignore[arg-type]


def test_records_every_step_with_automatic_metrics(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with attach(model, opt, tmp_path, total_steps=20) as mon:
        losses = train(model, opt, mon, 20, batch=4)
        mon.flush()
        h = mon.history()
    assert list(h["step"]) == list(range(1, 21))
    np.testing.assert_allclose(h["loss"], losses, rtol=1e-6)
    assert np.all(h["lr"] == 0.05)
    assert np.all(h["samples"] == 4)
    assert np.all(np.isfinite(h["step_time"])) and np.all(h["step_time"] > 0)
    np.testing.assert_allclose(h["samples_per_s"], 4 / h["step_time"])
    assert np.all(h["time"] > 1e9)
    assert "loss_smooth" in h


def test_grad_norm_matches_torch(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0 keeps weights fixed for the check
    x = torch.randn(4, 8)
    with attach(model, opt, tmp_path) as mon:
        model(x).pow(2).mean().backward()
        expected = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in model.parameters()])
        ).item()
        opt.step()
        mon.flush()
        h = mon.history()
    assert h["grad_norm"][0] == pytest.approx(expected, rel=1e-5)


def test_gradient_accumulation_counts_optimizer_steps(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 5, batch=3, accumulate=4)
        mon.flush()
        h = mon.history()
    assert list(h["step"]) == [1, 2, 3, 4, 5]
    assert np.all(h["micro_batches"] == 4)
    assert np.all(h["samples"] == 12)


def test_forward_pre_hook_times_the_first_step_then_goes(model, tmp_path, monkeypatch):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, phases=False) as mon:
        assert len(model._forward_pre_hooks) == 1
        time.sleep(0.2)  # attached long before training: not part of step 1
        start = time.perf_counter()
        train(model, opt, mon, 3)
        trained = time.perf_counter() - start
        assert len(model._forward_pre_hooks) == 0  # one Python call less per step
        mon.flush()
        h = mon.history()
    # Step 1 started at its forward, not at attach: it fits within the training (an order of
    # events, whatever the machine's speed).
    assert np.all(np.isfinite(h["step_time"])) and h["step_time"][0] <= trained
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 3)
        assert len(model._forward_pre_hooks) == 1  # each forward's start is a phase mark
    with attach(model, opt, tmp_path, activations=True, layer_every=2) as mon:
        taken: list[int] = []
        add = LayerStats.add_activations

        def counted(self: LayerStats, names: list[str], values: list[float]) -> None:
            taken.append(len(names))
            add(self, names, values)

        monkeypatch.setattr(LayerStats, "add_activations", counted)
        train(model, opt, mon, 4)
        assert len(model._forward_pre_hooks) == 1  # it opens activation sampling
        mon.flush()
    assert taken == [5, 5, 5, 5]  # early steps are all sampled (probes/base.due), 5 modules


def test_a_forward_that_raises_is_not_a_micro_batch(tmp_path):
    class Flaky(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)
            self.fail = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.fail:
                raise ValueError("bad batch")
            out: torch.Tensor = self.lin(x)
            return out

    model = Flaky()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        model.fail = True
        with pytest.raises(ValueError, match="bad batch"):
            model(torch.randn(5, 8))
        model.fail = False
        model(torch.randn(3, 8)).sum().backward()
        opt.step()
        mon.flush()
        h = mon.history()
    assert h["micro_batches"][0] == 1 and h["samples"][0] == 3


def test_logging_a_loss_that_requires_grad_warns_nothing(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon, warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = model(torch.randn(2, 8)).sum()
        loss.backward()
        opt.step()
        mon.log(loss=loss)  # torch warns when a tensor that requires grad becomes a float
        mon.flush()
        h = mon.history()
    assert h["loss"][0] == pytest.approx(loss.item())


def test_without_optimizer_steps_are_backward_passes(model, tmp_path):
    with attach(model, None, tmp_path) as mon:
        for _ in range(7):
            loss = model(torch.randn(2, 8)).sum()
            loss.backward()
            mon.log(loss=loss)
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
        assert mon.step == 7
        mon.flush()
        h = mon.history()
    assert list(h["step"]) == list(range(1, 8))
    assert np.all(np.isfinite(h["grad_norm"]))
    assert np.all(np.isfinite(h["loss"]))


def test_eval_forward_is_not_counted(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 2, batch=5)
        with torch.no_grad():
            model(torch.randn(100, 8))
        train(model, opt, mon, 1, batch=5)
        mon.flush()
        h = mon.history()
    assert list(h["samples"]) == [5, 5, 5]


def test_hf_style_loss_is_logged_without_log(tmp_path):
    model = HFStyle()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with attach(model, opt, tmp_path) as mon:
        for _ in range(3):
            out = model(input_ids=torch.randn(6, 4), labels=torch.randint(0, 2, (6,)))
            out.loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(out.loss.item())
        mon.flush()
        h = mon.history()
    np.testing.assert_allclose(h["loss"], losses, rtol=1e-6)
    assert list(h["samples"]) == [6, 6, 6]  # batch size read from kwargs


def test_log_before_step_belongs_to_the_step_in_progress(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        for i in range(3):
            model(torch.randn(2, 8)).sum().backward()
            mon.log(marker=float(i + 1))  # before step(): step i+1
            opt.step()
            opt.zero_grad()
            mon.log(after=float(i + 1))  # after step(): the step that just ended
        mon.flush()
        h = mon.history()
    assert list(h["marker"]) == [1.0, 2.0, 3.0]
    assert list(h["after"]) == [1.0, 2.0, 3.0]


def test_log_accepts_tensors_numbers_and_keeps_non_finite(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        mon.log(
            a=torch.tensor(1.5, dtype=torch.bfloat16),
            b=torch.tensor([7], dtype=torch.int64),
            c=np.float32(0.25),
            d=3,
            e=float("nan"),
            f=torch.tensor(float("inf")),
            g=torch.tensor(2.0, dtype=torch.float16),
        )
        mon.flush()
        h = mon.history()
    assert h["a"][0] == 1.5 and h["b"][0] == 7 and h["c"][0] == 0.25 and h["d"][0] == 3
    assert math.isnan(h["e"][0]) and h["f"][0] == math.inf and h["g"][0] == 2.0


def test_logged_tensor_changed_in_place_afterwards_keeps_the_logged_value(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    total = torch.zeros(())
    lr = torch.tensor(0.01)
    opt.param_groups[0]["lr"] = lr
    with attach(model, opt, tmp_path) as mon:
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            total += 1.0  # a running total, logged and then changed again
            mon.log(running=total)
            lr.mul_(0.5)  # a scheduler that changes the lr tensor in place
        mon.flush()
        h = mon.history()
    assert h["running"].tolist() == [1.0, 2.0, 3.0]
    assert h["lr"].tolist() == pytest.approx([0.01, 0.005, 0.0025])


def test_several_values_in_one_step_are_averaged(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        for v in (1.0, 2.0, 6.0):
            model(torch.randn(2, 8)).sum().backward()
            mon.log(loss=v)
        opt.step()
        mon.flush()
        h = mon.history()
    assert h["loss"][0] == 3.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("high", "needs a number or a tensor, got str"),
        (None, "needs a number or a tensor, got NoneType"),
        (torch.ones(3), "pass a 0-d or 1-element tensor"),
        (torch.tensor(1 + 2j), "got a complex tensor"),
        ([1.0], "needs a number or a tensor, got list"),
    ],
)
def test_log_rejects_non_numeric(model, tmp_path, value, message):
    with attach(model, None, tmp_path) as mon, pytest.raises(TypeError, match=message):
        mon.log(x=value)


@pytest.mark.parametrize(
    ("key", "message"),
    [("", "empty name"), ("x" * 10_000, "a name of 10000 characters")],
)
def test_log_refuses_a_name_no_column_can_have(model, tmp_path, key, message):
    with attach(model, None, tmp_path) as mon:
        with pytest.raises(ValueError, match=message) as raised:
            mon.log(loss=1.0, **{key: 1.0})
        assert len(str(raised.value)) < 300 and "\n" not in str(raised.value)  # one line
        mon.log(loss=1.0, **{"x" * 200: 1.0})  # the longest name taken
        mon.flush()
        assert "x" * 200 in mon.history()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_logged_nan_loss_is_an_alert_as_inf_is(model, tmp_path, bad):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        for step in range(1, 6):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=bad if step == 4 else 1.0)
        mon.flush()
        found = [(e.rule, e.step) for e in mon.events() if e.rule == "loss_non_finite"]
    assert found == [("loss_non_finite", 4)]


def test_close_removes_hooks_and_is_idempotent(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = hook_counts(model, opt)
    mon = attach(model, opt, tmp_path, interval=0.05)
    assert hook_counts(model, opt) == before + 4
    train(model, opt, mon, 3)
    mon.close()
    mon.close()
    assert hook_counts(model, opt) == before
    assert mon.status == "closed"
    train(model, opt, mon, 2)  # logging into a closed monitor is a no-op, not an error
    assert len(mon.history()["step"]) == 3


def test_reattach_replaces_previous_monitor(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    first = attach(model, opt, tmp_path, interval=0.05)
    train(model, opt, first, 2)
    second = attach(model, opt, tmp_path, interval=0.05)
    try:
        assert first.status == "closed"
        assert hook_counts(model, opt) == 4
        assert first.run_dir != second.run_dir
        train(model, opt, second, 3)
        second.flush()
        assert len(second.history()["step"]) == 3
        first.flush()
        assert len(first.history()["step"]) == 2
        # the first run's log was closed with everything it had
        assert len(nbmonitor.open(first.run_dir).history()["step"]) == 2
    finally:
        second.close()
    assert hook_counts(model, opt) == 0


def test_bad_argument_in_reattach_keeps_the_running_monitor(model, tmp_path):
    first = attach(model, None, tmp_path)
    try:
        with pytest.raises(ValueError, match="interval"):
            attach(model, None, tmp_path, interval=0)
        assert first.status == "running"
    finally:
        first.close()


def test_two_models_at_once(tmp_path):
    a, b = mlp(), mlp()
    oa = torch.optim.SGD(a.parameters(), lr=0.01)
    ob = torch.optim.SGD(b.parameters(), lr=0.01)
    with attach(a, oa, tmp_path) as ma, attach(b, ob, tmp_path) as mb:
        train(a, oa, ma, 2)
        train(b, ob, mb, 5)
        assert ma.status == mb.status == "running"
        ma.flush()
        mb.flush()
        assert len(ma.history()["step"]) == 2 and len(mb.history()["step"]) == 5


def test_sampler_thread_samples_system_stamped_with_step(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, interval=0.05) as mon:
        train(model, opt, mon, 3)

        def stamped_after_training() -> bool:
            # Ticks may come during the three steps (a slow first step) or only after them (a
            # fast machine): wait for three samples, the last one taken after step 3.
            s = mon.system()
            return len(s.get("time", [])) >= 3 and s["step"][-1] == 3

        assert wait_for(stamped_after_training)
        s = mon.system()
    for key in (
        "cpu_percent",
        "process_cpu_percent",
        "process_rss_bytes",
        "ram_used_bytes",
        "ram_total_bytes",
        "torch_threads",
    ):
        assert key in s
    assert len(s["time"]) >= 3
    assert s["step"][-1] == 3
    assert np.all(s["process_rss_bytes"] > 0)


def test_failing_sampler_source_degrades_but_training_goes_on(model, tmp_path, monkeypatch):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:

        def boom() -> dict[str, float]:
            raise RuntimeError("sensor unplugged")

        monkeypatch.setattr(mon.backend, "sample", boom)
        for _ in range(7):
            train(model, opt, mon, 1)
            mon.flush()
        assert mon.status == "degraded"
        assert any("sample: RuntimeError: sensor unplugged" in e for e in mon.errors)
        assert mon.errors_log.counts["sample"] == 5  # switched off after 5 failures in a row
        assert "sample" in mon.errors_log.disabled
        mon.flush()
        assert len(mon.history()["step"]) == 7  # steps still recorded


def test_failing_hook_never_reaches_the_loop(model, tmp_path, monkeypatch):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:

        def broken(*a: object, **k: object) -> None:
            raise ValueError("bad grads")

        monkeypatch.setattr("nbmonitor._capture.probes.grad_norms.NormPass.take", broken)
        train(model, opt, mon, 8)
        mon.flush()
        h = mon.history()
        assert mon.status == "degraded"
        assert any("probe:grad_norms: ValueError: bad grads" in e for e in mon.errors)
        assert mon.errors_log.counts["probe:grad_norms"] == 5  # then switched off
        assert "hook:optimizer_pre_step" not in mon.errors_log.counts  # the clock goes on
    assert len(h["step"]) == 8 and "grad_norm" not in h


def test_run_log_readable_while_writing(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, name="exp1") as mon:
        train(model, opt, mon, 4)
        mon.flush()  # every step that ended, the last one too
        run = nbmonitor.open(mon.run_dir)
        assert list(run.history()["step"]) == [1, 2, 3, 4]
        assert len(run.system()["time"]) == 1
        meta = run.meta
        assert meta["model"]["class"] == "Sequential"
        assert meta["optimizer"]["class"] == "SGD"
        assert meta["attach"]["name"] == "exp1"
        assert meta["backend"]["name"] == "cpu"
        assert mon.run_dir.name.endswith("-exp1")
    run = nbmonitor.open(mon.run_dir)
    assert list(run.history()["step"]) == [1, 2, 3, 4]
    assert run.meta["steps"] == 4


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        ({"model": [1, 2]}, TypeError, "model must be a torch.nn.Module, got list"),
        ({"optimizer": "adam"}, TypeError, "optimizer must be a torch.optim.Optimizer"),
        ({"interval": 0}, ValueError, "interval must be a number of seconds > 0"),
        ({"interval": -1.0}, ValueError, "interval must be a number of seconds > 0"),
        ({"interval": float("nan")}, ValueError, "interval must be a number of seconds > 0"),
        ({"interval": "fast"}, ValueError, "interval must be a number of seconds > 0"),
        ({"backend": "tpu"}, ValueError, "unknown backend 'tpu'"),
        ({"total_steps": 0}, ValueError, "total_steps must be a positive int"),
        ({"name": 5}, TypeError, "name must be a str"),
    ],
)
def test_bad_input_gets_one_line_message(model, tmp_path, kwargs, exc, message):
    args = {"model": model, "optimizer": None, "run_dir": tmp_path, "display": False}
    args.update(kwargs)
    with pytest.raises(exc, match=message) as info:
        nbmonitor.attach(args.pop("model"), args.pop("optimizer"), **args)
    assert "\n" not in str(info.value)


def test_optimizer_of_another_model_is_rejected(model, tmp_path):
    other = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(ValueError, match="holds none of the model's parameters"):
        nbmonitor.attach(model, other, run_dir=tmp_path, display=False)


def test_unwritable_run_dir(model, tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(nbmonitor.RunDirError, match="run_dir") as info:
        nbmonitor.attach(model, None, run_dir=blocker / "sub", display=False)
    assert "\n" not in str(info.value)
    assert hook_counts(model, None) == 0


def test_console_view_prints_status_and_summary(model, tmp_path, caplog):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    caplog.set_level("INFO", logger="nbmonitor")
    with attach(model, opt, tmp_path, total_steps=10, display=True) as mon:
        train(model, opt, mon, 4)
        mon.flush()
    text = caplog.text
    assert "step 4/10" in text and "loss" in text and "ms/step" in text and "ETA" in text
    assert "4 steps in" in text  # the closing summary


def test_kill_leaves_readable_log(tmp_path):
    """SIGKILL a monitored loop: the run log holds the steps up to the last interval."""
    script = textwrap.dedent(f"""
        import torch, nbmonitor, sys
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        mon = nbmonitor.attach(model, opt, run_dir={str(tmp_path)!r}, interval=0.05,
                               display=False)
        print(mon.run_dir, flush=True)
        while True:
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad(); mon.log(loss=loss)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        run_dir = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]

        def lines(name: str) -> int:
            path = run_dir / name
            return path.read_text().count("\n") if path.exists() else 0

        # Killed mid-run once the log holds 50 steps and two system samples, however long a
        # loaded machine takes to write them (a fast one writes 50 steps in its first tick).
        assert wait_for(lambda: lines("steps.jsonl") >= 50 and lines("system.jsonl") >= 2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
        proc.stdout.close()  # type: ignore[union-attr]
    run = nbmonitor.open(run_dir)
    steps = run.history()["step"]
    assert len(steps) >= 50
    np.testing.assert_array_equal(steps, np.arange(1, len(steps) + 1))
    assert np.all(np.isfinite(run.history()["loss"]))
    assert len(run.system()["time"]) >= 2


def test_demo_command(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbmonitor",
            "demo",
            "--seconds",
            "2",
            "--run-dir",
            str(tmp_path),
            "--interval",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "run written to" in out.stdout
    assert "nbmonitor: step" in out.stderr  # the console status line
    run_dirs = list(tmp_path.iterdir())
    assert len(run_dirs) == 1
    assert (
        len(nbmonitor.open(run_dirs[0]).history()["step"]) > 3
    )  # steps recorded (a loaded machine runs few)


def test_energy_per_step_and_sample_from_gpu_counter(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        energy = iter([100.0, 130.0, 160.0])
        sample = mon.backend.sample

        def with_energy() -> dict[str, float]:
            return {**sample(), "gpu0_energy_j": next(energy)}

        mon.backend.device_index = 0  # type: ignore[attr-defined]
        mon.internals.pipeline.model.device_index = 0  # the run model reads the GPU's counter
        mon.backend.sample = with_energy  # type: ignore[method-assign]
        for _ in range(3):
            train(model, opt, mon, 2, batch=5)
            mon.flush()
        latest = mon.frame().latest
    assert latest["energy_per_step_j"] == pytest.approx(15.0)  # 30 J per 2 steps
    assert latest["energy_per_sample_j"] == pytest.approx(3.0)  # 5 samples per step


def test_backend_notes_become_info_alerts(model, tmp_path):
    with attach(model, None, tmp_path) as mon:
        mon.backend.notes = ["NVML fields are NaN: pynvml not installed"]  # type: ignore[attr-defined]
        mon.flush()
        mon.flush()
        events = [a for a in mon.events() if a.rule == "backend"]
    assert [(a.severity, a.message) for a in events] == [
        ("info", "NVML fields are NaN: pynvml not installed")
    ]
    assert "backend='cpu'" in repr(mon)


def test_console_view_gets_frames_without_series(model, tmp_path):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        frames = []

        class Spy:
            wants_detail = False

            def publish(self, frame: object) -> None:
                frames.append(frame)

            def close(self, frame: object) -> None:
                frames.append(frame)

        mon.add_view(Spy())
        train(model, opt, mon, 3)
        mon.flush()
    assert frames and frames[0].series == {} and frames[0].layers is None
    assert math.isfinite(frames[0].latest["loss"])
    assert mon.frame().series and mon.frame().layers is not None


def test_internal_failure_in_log_is_counted_not_raised(model, tmp_path, monkeypatch):
    with attach(model, None, tmp_path) as mon:

        def broken(*a: object, **k: object) -> None:
            raise RuntimeError("device went away")

        monkeypatch.setattr("nbmonitor._capture.clock.make_log_record", broken)
        mon.log(acc=1.0)  # must not raise (a float loss alone takes the short way, no call)
        assert mon.status == "degraded"
        assert any("log: RuntimeError: device went away" in e for e in mon.errors)


def test_scheduled_ticks_pace_the_health_rules_but_flush_runs_them(model, tmp_path, monkeypatch):
    checks: list[float] = []  # when each check started
    check = Health.check
    ticks: list[bool] = []
    tick = Pipeline.tick

    def counting(self: Health, inp: object, **options: object) -> object:
        checks.append(time.monotonic())
        return check(self, inp, **options)

    def ticking(self: Pipeline, paced: bool) -> None:
        ticks.append(paced)
        tick(self, paced)

    monkeypatch.setattr(Health, "check", counting)
    monkeypatch.setattr(Pipeline, "tick", ticking)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, interval=0.02) as mon:
        train(model, opt, mon, 3)
        # 50 scheduled ticks and two paced checks, however long a loaded machine takes.
        assert wait_for(lambda: sum(ticks) >= 50 and len(checks) >= 2)
        paced = len(checks)
        # Paced: a check costs at least 0.1 ms of CPU and may take 0.1 % of it, so checks are
        # 0.1 s apart or more, never every 20 ms tick (load only spreads them further).
        assert min(np.diff(checks[:paced])) >= 0.05, np.diff(checks[:paced])
        assert paced < sum(ticks)
        mon.flush()
        assert len(checks) > paced  # a flush runs them, unpaced


def test_a_health_check_that_left_slices_runs_again_on_the_next_tick(model, tmp_path, monkeypatch):
    # One slice more once the budget is spent, and a pace that would put checks hours apart:
    # only being behind brings the next check on the next tick.
    monkeypatch.setattr("nbmonitor._engine.pipeline.HEALTH_BUDGET_S", 0.0)
    monkeypatch.setattr("nbmonitor._engine.pipeline.HEALTH_SHARE", 1e-9)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        pipeline = mon.internals.pipeline
        health = pipeline.parts.health
        train(model, opt, mon, 200)
        checks: list[float | None] = []  # the step judged after each check
        check = Health.check

        def counting(self: Health, inp: object, **options: object) -> object:
            found = check(self, inp, **options)
            checks.append(self.judged_step)
            return found

        monkeypatch.setattr(Health, "check", counting)
        behind = []
        for _ in range(40):  # the sampler's scheduled ticks, driven here (interval 60 s)
            before = len(checks)
            pipeline.tick(paced=True)
            behind.append((len(checks) > before, health.behind))
            if not health.behind and len(checks) > 1:
                break
        # Each check judged two slices of the 12 grid points up to step 199 (16, 32, ..., 192;
        # more if the rows' recorded times cross the 5 s time grid) and was followed by
        # another on the very next tick, until none was left.
        assert len(checks) >= 2 and all(ran for ran, _ in behind)
        assert all(b is not None and a is not None and b > a for a, b in itertools.pairwise(checks))
        assert checks[-1] is not None and checks[-1] >= 192 and not health.behind
        pipeline.tick(paced=True)
        assert len(checks) == len(behind)  # caught up: paced again


def test_paced_health_judges_steps_beyond_the_window(model, tmp_path, monkeypatch):
    monkeypatch.setattr("nbmonitor._engine.pipeline.HEALTH_WINDOW", 4)
    seen = []
    check = Health.check
    monkeypatch.setattr(
        Health,
        "check",
        lambda self, inp, **kw: seen.append(len(inp.steps["step"])) or check(self, inp, **kw),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, interval=60) as mon:
        train(model, opt, mon, 10)
        mon.flush()
    # Every row the flush took (every step that ended), not just 4.
    assert seen[0] == 10


def test_a_monitored_run_does_not_import_numpy_ma(tmp_path):
    # np.median imports numpy.ma the first time (~20 ms on the sampler thread, holding the GIL
    # and so stalling the training loop once): the rules and the ETA must not need it.
    script = textwrap.dedent(
        f"""
        import sys, torch, nbmonitor
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with nbmonitor.attach(model, opt, total_steps=400, run_dir={str(tmp_path)!r},
                              display=False, interval=60) as mon:
            for i in range(400):
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
                mon.log(loss=1.0)
                if i % 20 == 19:
                    mon.flush()
                    mon.frame()
            mon.flush()
            rules = [event.rule for event in mon.events()]
        print(sorted(rules), "numpy.ma" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    # The plateau rule (one np.median before) and the ETA have both run.
    assert out.stdout.split("]")[0].count("loss_plateau") == 1
    assert out.stdout.strip().endswith("False"), out.stdout
