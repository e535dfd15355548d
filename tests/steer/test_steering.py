"""Steering a live run from Python: pause, resume, stop, checkpoint and lr, applied at the next
step boundary (after ``optimizer.step()``), recorded as events, free when unused."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

import pytest
import torch
from tests.helpers import wait_for

import nbmonitor
from nbmonitor.errors import StopTraining, StopTrainingExit


def _setup(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.randn(64, 4)
    return model, opt, data


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    opt.zero_grad()
    return float(loss.detach())


def _steer_events(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("rule") == "steer"]


def test_an_unused_run_has_no_step_listener(tmp_path: Path) -> None:
    model, opt, data = _setup()
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        clock = mon.internals.clock()
        assert clock is not None
        _step(model, opt, data[:8])
        assert mon.steering.at_boundary not in clock.step_listeners
        mon.set_lr(0.02)
        assert mon.steering.at_boundary in clock.step_listeners  # only while pending
        _step(model, opt, data[:8])
        assert mon.steering.at_boundary not in clock.step_listeners
        assert mon.steering.pending == 0


def test_set_lr_applies_to_every_group_and_the_scheduler_and_is_an_event(tmp_path: Path) -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    model = torch.nn.Sequential(a, b)
    opt = torch.optim.SGD([{"params": a.parameters(), "lr": 0.1}, {"params": b.parameters()}], 0.2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, scheduler=sched)
    x = torch.randn(8, 4)
    _step(model, opt, x)
    sched.step()  # lr 0.05 and 0.1
    mon.set_lr(0.01)
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.1]  # not before the step's end
    _step(model, opt, x)
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.01]
    # The schedule goes on from the new level: base_lrs scaled by the same factor.
    assert sched.base_lrs == pytest.approx([0.02, 0.02])
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.005, 0.005])
    _step(model, opt, x)
    mon.flush()
    assert mon.history()["lr"].tolist() == pytest.approx([0.1, 0.05, 0.005])
    mon.close()
    (event,) = _steer_events(mon.run_dir)
    assert event["step"] == 2
    assert event["evidence"] == {"action": "lr", "value": 0.01, "source": "python", "ok": True}
    assert "0.01" in str(event["message"])
    (alert,) = [a for a in mon.events() if a.rule == "steer"]
    assert alert.evidence["value"] == 0.01


def test_bad_requests_raise_at_the_call(tmp_path: Path) -> None:
    model, opt, _ = _setup()
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for bad in ("abc", float("nan"), -1.0, True, None):
            with pytest.raises(ValueError, match="set_lr"):
                mon.set_lr(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="checkpoint path"):
            mon.checkpoint(3)  # type: ignore[arg-type]
        # From another source (a file, a widget) nothing raises: it is an event.
        mon.steering.request("lr", "abc", source="ctl")
        mon.steering.request("jump", source="ctl")
        assert mon.steering.pending == 0
    refused = _steer_events(mon.run_dir)
    assert [e["severity"] for e in refused] == ["warning", "warning"]
    assert "lr needs a number" in str(refused[0]["message"])
    assert "unknown request 'jump'" in str(refused[1]["message"])


def test_attach_checks_the_steering_options(tmp_path: Path) -> None:
    model, opt, _ = _setup()
    with pytest.raises(TypeError, match="scheduler must be an lr scheduler"):
        nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, scheduler=object())
    with pytest.raises(TypeError, match="on_checkpoint must be a callable"):
        nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, on_checkpoint="x")  # type: ignore[typeddict-item]


def test_pause_holds_the_loop_at_a_boundary_until_resume(tmp_path: Path) -> None:
    model, opt, data = _setup()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    done = threading.Event()
    steps_seen: list[int] = []

    def loop() -> None:
        for i in range(10):
            _step(model, opt, data[i : i + 8])
            steps_seen.append(mon.step)
        done.set()

    mon.pause()
    thread = threading.Thread(target=loop)
    thread.start()
    assert wait_for(lambda: mon.steering.paused)
    assert steps_seen == []  # paused inside the first optimizer.step(), after its update
    assert mon.step == 1
    assert not done.wait(0.3)
    assert mon.step == 1
    mon.resume()
    assert done.wait(60)
    thread.join()
    assert steps_seen == list(range(1, 11))
    mon.close()
    messages = [e["message"] for e in _steer_events(mon.run_dir)]
    assert messages == [
        "Paused at step 1 (asked from python).",
        "Resumed at step 1 (asked from python).",
    ]


def test_stop_ends_the_loop_after_the_update_and_closes_the_run_stopped(tmp_path: Path) -> None:
    model, opt, data = _setup()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    before = None
    with pytest.raises(StopTraining) as info:
        for i in range(20):
            if i == 5:
                mon.stop()
                before = [p.detach().clone() for p in model.parameters()]
            _step(model, opt, data[i : i + 8])
    assert info.value.step == 6
    # Raised in the main thread of a script (no IPython): also a SystemExit with status 0.
    assert isinstance(info.value, StopTrainingExit) and info.value.code == 0
    assert before is not None  # the update of step 6 was applied before the stop
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert mon.status == "stopped"
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["status"] == "stopped"
    run = nbmonitor.open(mon.run_dir)
    assert run.status == "stopped"
    assert run.history()["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert [e["message"] for e in _steer_events(mon.run_dir)] == [
        "Stopped at step 6 (asked from python)."
    ]
    # The hooks are gone: the loop may go on unmonitored.
    _step(model, opt, data[:8])
    mon.close()


def test_a_stop_in_a_thread_ends_it_silently(tmp_path: Path) -> None:
    model, opt, data = _setup()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    seen: list[int] = []

    def loop() -> None:
        for i in range(50):
            if i == 3:
                mon.stop()
            _step(model, opt, data[i : i + 8])
            seen.append(i)

    thread = threading.Thread(target=loop)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        thread.start()
        thread.join(60)
    assert seen == [0, 1, 2]
    assert stderr.getvalue() == ""  # no "Exception in thread"
    assert json.loads((mon.run_dir / "meta.json").read_text())["status"] == "stopped"


def test_checkpoint_saves_and_a_new_run_resumes_from_it(tmp_path: Path) -> None:
    model, opt, data = _setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, scheduler=sched)
    losses = []
    for i in range(12):
        if i == 6:
            mon.checkpoint()
        losses.append(_step(model, opt, data[i : i + 8]))
        sched.step()
    mon.close()
    path = mon.run_dir / "checkpoints" / "step-7.pt"
    assert sorted(p.name for p in path.parent.iterdir()) == ["step-7.pt"]  # no temp file left
    ckpt = torch.load(path)
    assert ckpt["step"] == 7
    assert set(ckpt) == {"model", "optimizer", "scheduler", "step"}

    # A fresh process's way back: the same objects built again, loaded, attached at the step.
    model2, opt2, _ = _setup(seed=1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=4, gamma=0.5)
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    sched2.load_state_dict(ckpt["scheduler"])
    sched2.step()  # the loop stepped the scheduler after the step the checkpoint was taken at
    mon2 = nbmonitor.attach(model2, opt2, run_dir=tmp_path, display=False, start_step=ckpt["step"])
    resumed = []
    for i in range(7, 12):
        resumed.append(_step(model2, opt2, data[i : i + 8]))
        sched2.step()
    mon2.close()
    assert resumed == pytest.approx(losses[7:], rel=1e-6)  # the loss curve goes on
    assert nbmonitor.open(mon2.run_dir).history()["step"].tolist() == [8, 9, 10, 11, 12]


def test_on_checkpoint_is_called_instead(tmp_path: Path) -> None:
    model, opt, data = _setup()
    calls: list[tuple[Path, int]] = []
    with nbmonitor.attach(
        model,
        opt,
        run_dir=tmp_path,
        display=False,
        on_checkpoint=lambda path, step: calls.append((path, step)),
    ) as mon:
        _step(model, opt, data[:8])
        mon.checkpoint(tmp_path / "mine.pt")
        _step(model, opt, data[:8])
    assert calls == [(tmp_path / "mine.pt", 2)]
    assert not (tmp_path / "mine.pt").exists()


def test_the_time_paused_is_not_the_next_steps(tmp_path: Path) -> None:
    import time

    model, opt, data = _setup()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05)
    mon.pause()
    thread = threading.Thread(target=lambda: [_step(model, opt, data[:8]) for _ in range(4)])
    thread.start()
    assert wait_for(lambda: mon.steering.paused)
    start = time.perf_counter()
    time.sleep(1.5)
    paused_for = time.perf_counter() - start
    mon.resume()
    thread.join(60)
    mon.flush()
    history = mon.history()
    mon.close()
    steps = history["step"].tolist()
    assert steps == [1.0, 2.0, 3.0, 4.0]
    # Step 2 began when the pause after step 1 ended: its time and its wait for data are its
    # own, not the pause's (which counted in both before).
    assert history["step_time"][1] < paused_for / 2, history["step_time"]
    assert history["phase_data_s"][1] < paused_for / 2, history["phase_data_s"]


def test_close_lets_a_paused_loop_go_on(tmp_path: Path) -> None:
    model, opt, data = _setup()
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    mon.pause()
    thread = threading.Thread(target=lambda: [_step(model, opt, data[:8]) for _ in range(3)])
    thread.start()
    assert wait_for(lambda: mon.steering.paused)
    mon.close()
    thread.join(60)
    assert not thread.is_alive()
    assert not mon.steering.paused
    assert json.loads((mon.run_dir / "meta.json").read_text())["status"] == "closed"


def test_an_interrupt_while_paused_ends_the_pause(tmp_path: Path) -> None:
    import _thread

    model, opt, data = _setup()
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        mon.pause()
        interrupter = threading.Thread(
            target=lambda: wait_for(lambda: mon.steering.paused) and _thread.interrupt_main()
        )
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            _step(model, opt, data[:8])
        interrupter.join()
        assert not mon.steering.paused
        clock = mon.internals.clock()
        assert clock is not None and mon.steering.at_boundary not in clock.step_listeners
        _step(model, opt, data[:8])  # goes on unpaused
        assert mon.step == 2


def test_without_an_optimizer_the_stop_comes_from_the_next_forward(tmp_path: Path) -> None:
    model, _, data = _setup()
    mon = nbmonitor.attach(model, run_dir=tmp_path, display=False)
    done = []
    with pytest.raises(StopTraining) as info:
        for i in range(20):
            if i == 4:
                mon.stop()
            loss = model(data[i : i + 8]).pow(2).mean()
            loss.backward()  # type: ignore[no-untyped-call]
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad  # type: ignore[operator]
                    p.grad = None
            done.append(i)
    assert done == [0, 1, 2, 3, 4]  # the pass that ended step 5 completed, backward included
    assert info.value.step == 5
    assert nbmonitor.open(mon.run_dir).status == "stopped"
    model(data[:8])  # the hook went with the stop


def test_a_request_for_a_later_step_waits_for_its_boundary(tmp_path: Path) -> None:
    model, opt, data = _setup()
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        _step(model, opt, data[:8])
        mon.steering.request("lr", 0.5, at_step=4)
        lrs = []
        for i in range(5):
            _step(model, opt, data[i : i + 8])
            lrs.append(opt.param_groups[0]["lr"])
        assert lrs == [0.01, 0.01, 0.5, 0.5, 0.5]  # after steps 2, 3, 4 (applied), 5, 6
        assert mon.steering.pending == 0


def test_a_flood_of_requests_is_bounded(tmp_path: Path) -> None:
    from nbmonitor._capture.steer import MAX_PENDING

    model, opt, data = _setup()
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(MAX_PENDING + 10):
            mon.steering.request("lr", 0.02, source="ctl")
        assert mon.steering.pending == MAX_PENDING
        _step(model, opt, data[:8])
        assert mon.steering.pending == 0
        assert opt.param_groups[0]["lr"] == 0.02
    events = _steer_events(mon.run_dir)
    assert sum(e["severity"] == "warning" for e in events) == 10
    assert sum(e["severity"] == "info" for e in events) == MAX_PENDING


def test_set_lr_keeps_a_tensor_learning_rate_a_tensor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    lr = torch.tensor(0.01)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        mon.set_lr(0.003)
        _step(model, opt, torch.randn(8, 4))
        assert opt.param_groups[0]["lr"] is lr  # changed in place, as the optimizer holds it
        assert float(lr) == pytest.approx(0.003)


def test_at_pythons_own_prompt_a_stop_is_one_line(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import torch, nbmonitor\n"
        "m = torch.nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        f"mon = nbmonitor.attach(m, opt, run_dir={str(tmp_path)!r}, display=False)\n"
        "for i in range(100):\n"
        "    if i == 2: mon.stop()\n"
        "    m(torch.randn(4, 2)).sum().backward(); opt.step(); opt.zero_grad()\n"
        "\n"
        "print('still here', mon.status, mon.step)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-i", "-q"],
        input=code,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in done.stderr
    assert "nbmonitor: training stopped at step 3" in done.stderr
    assert "still here stopped 3" in done.stdout
