"""``mon.profile()``: torch.profiler over the next steps of a real loop, its table and trace,
one at a time, no profiler left running, and one-line errors for bad arguments."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
import torch
from tests.tiny_lm import TinyLM, lm_step

import nbmonitor
from nbmonitor._capture.profiler import COLUMNS, MAX_ROWS


def _loop(tmp_path: Path) -> tuple[TinyLM, torch.optim.Optimizer, nbmonitor.Monitor]:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False)
    return model, opt, mon


def test_profile_records_the_next_steps_and_shows_the_table(tmp_path: Path) -> None:
    model, opt, mon = _loop(tmp_path)
    try:
        lm_step(model, opt)  # step 1
        prof = mon.profile(steps=2, wait=1, warmup=1)
        assert prof.state == "waiting" and not prof.done
        # Starts as step 2 ends: step 3 waits, step 4 warms up, steps 5 and 6 are recorded.
        for _ in range(5):
            lm_step(model, opt)
        assert prof.wait(60)
        assert prof.error is None
        assert prof.steps == (5, 6)
        assert not torch.autograd._profiler_enabled()
        rows = prof.rows
        assert 0 < len(rows) <= MAX_ROWS
        assert set(rows[0]) == {key for key, _, _ in COLUMNS}
        names = {row["name"] for row in rows}
        assert {"aten::mm", "aten::addmm"} & names
        assert "ProfilerStep#3" in names or any(n.startswith("ProfilerStep") for n in names)
        self_cpu = [row["self_cpu_ms"] for row in rows]
        assert self_cpu == sorted(self_cpu, reverse=True)  # costliest first on the CPU
        assert "Self CPU" in prof.table()
        trace = prof.trace_path
        assert trace is not None and trace.parent == mon.run_dir / "profiles"
        events = json.loads(trace.read_text())["traceEvents"]
        assert any(e.get("name") == "aten::mm" for e in events)
        assert (trace.parent / "steps-5-6.txt").read_text() == prof.table()
        # A second profile works once the first is done.
        second = mon.profile(steps=1, wait=0, warmup=0)
        for _ in range(2):
            lm_step(model, opt)
        assert second.wait(60) and second.error is None
        assert second.steps == (8, 8)
        assert not torch.autograd._profiler_enabled()
        assert mon.errors == []
    finally:
        mon.close()
    assert not [t for t in threading.enumerate() if t.name == "nbmonitor-profile"]


def test_one_profile_at_a_time_and_close_stops_one_running(tmp_path: Path) -> None:
    model, opt, mon = _loop(tmp_path)
    try:
        prof = mon.profile(steps=3, wait=0, warmup=0)
        with pytest.raises(RuntimeError, match=r"a profile is already waiting; wait for it"):
            mon.profile()
        lm_step(model, opt)
        lm_step(model, opt)  # recording now
        assert prof.state == "profiling" and torch.autograd._profiler_enabled()
    finally:
        mon.close()
    assert not torch.autograd._profiler_enabled()
    assert prof.done and prof.error == "The profile was cancelled before it finished."
    with pytest.raises(RuntimeError, match=r"profile\(\) on a closed monitor; attach again"):
        mon.profile()


def test_cancel_stops_the_profiler_and_allows_another(tmp_path: Path) -> None:
    model, opt, mon = _loop(tmp_path)
    with mon:
        prof = mon.profile(steps=5, wait=0, warmup=0)
        lm_step(model, opt)
        lm_step(model, opt)
        prof.cancel()
        assert not torch.autograd._profiler_enabled()
        lm_step(model, opt)  # the loop goes on untouched
        again = mon.profile(steps=1, wait=0, warmup=0)
        lm_step(model, opt)
        lm_step(model, opt)
        assert again.wait(60) and again.error is None


def test_a_running_user_profiler_is_left_alone(tmp_path: Path) -> None:
    model, opt, mon = _loop(tmp_path)
    with mon:
        prof = mon.profile(steps=1, wait=0, warmup=0)
        with torch.profiler.profile() as own:
            with pytest.raises(RuntimeError, match="another torch profiler is running; stop it"):
                mon.profile()  # refused at the call
            lm_step(model, opt)  # the one asked for before finds it at its start
            lm_step(model, opt)
            assert torch.autograd._profiler_enabled()
        assert prof.done
        assert prof.error is not None and "another torch profiler is running" in prof.error
        assert mon.errors == []  # the user's choice, not nbmonitor failing
    assert any(e.key == "aten::mm" for e in own.key_averages())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, r"profile\(steps=\.\.\.\) must be an int from 1 to 1000, got 0"),
        ({"steps": True}, r"profile\(steps=\.\.\.\) must be an int from 1 to 1000, got True"),
        ({"wait": -1}, r"profile\(wait=\.\.\.\) must be an int from 0 to 1000, got -1"),
        ({"warmup": 1.5}, r"profile\(warmup=\.\.\.\) must be an int from 0 to 1000, got 1.5"),
        ({"steps": "3"}, r"profile\(steps=\.\.\.\) must be an int from 1 to 1000, got '3'"),
    ],
)
def test_bad_arguments_get_one_line_errors(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    _, _, mon = _loop(tmp_path)
    with mon, pytest.raises(ValueError, match=message) as info:
        mon.profile(**kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_in_a_script_the_result_goes_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt, mon = _loop(tmp_path)
    with mon, caplog.at_level(logging.INFO, logger="nbmonitor"):
        prof = mon.profile(steps=1, wait=0, warmup=0)
        lm_step(model, opt)
        lm_step(model, opt)
        assert prof.wait(60)
    assert f"profile of steps 2-2: trace {prof.trace_path}" in caplog.text


def test_in_a_notebook_the_table_shows_at_the_call_and_fills_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbmonitor.ui.panels.profile import ProfileView

    shown: list[ProfileView] = []
    monkeypatch.setattr("nbmonitor.ui.notebook.in_notebook", lambda: True)
    monkeypatch.setattr(ProfileView, "display", lambda self: shown.append(self))
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60, display=False) as mon:
        assert shown == []  # display=False: no profile table either
    with nbmonitor.attach(model, opt, run_dir=tmp_path, interval=60) as mon:
        prof = mon.profile(steps=1, wait=0, warmup=1)
        [view] = shown
        assert view.widget.status.startswith("torch.profiler: waiting for the next step")
        assert view.widget.rows == []
        for _ in range(3):
            lm_step(model, opt)
        assert prof.wait(60)
        assert view.widget.status == "" and view.widget.title == "torch.profiler, steps 3-3"
        assert len(view.widget.rows) == len(prof.rows)
        assert view.widget.trace_path == str(prof.trace_path)
        bundle = prof._repr_mimebundle_()
        assert "application/vnd.jupyter.widget-view+json" in bundle
        assert "aten::" in bundle["text/html"]


def test_a_profiler_that_fails_to_start_is_not_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On an H200, torch's start() raised half-way (a warning made an error); stopping that
    # profiler then started a trace that was never prepared and crashed the process.
    stops: list[object] = []

    def start(self: torch.profiler.profile) -> None:
        raise RuntimeError("start failed half-way")

    monkeypatch.setattr(torch.profiler.profile, "start", start)
    monkeypatch.setattr(torch.profiler.profile, "stop", lambda self: stops.append(self))
    model, opt, mon = _loop(tmp_path)
    with mon:
        prof = mon.profile(steps=1, wait=0, warmup=1)
        lm_step(model, opt)
        lm_step(model, opt)  # the loop goes on
        assert prof.done and prof.error is not None and "start failed half-way" in prof.error
    assert stops == []
    assert len(mon.errors) == 1 and " profile: RuntimeError: start failed half-way" in mon.errors[0]
