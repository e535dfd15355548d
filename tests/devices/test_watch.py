"""nbmonitor.devices(): a watch of the machine with a run's sampler, rules and run log,
against fake NVML devices."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nbmonitor
from fake_pynvml import FakeGpu, FakeNvml
from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.health import Thresholds
from nbmonitor.machine.watch import DeviceWatch, close_all
from nbmonitor.ui.devices import DevicesDashboard, panel_state


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [FakeGpu(f"GPU-{k}", util=30 * k, processes=[(1, 2**30)]) for k in range(2)]


@pytest.fixture(autouse=True)
def nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> Iterator[FakeNvml]:
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake
    close_all()


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class Recorder:
    def __init__(self) -> None:
        self.frames: list[DevicesFrame] = []
        self.closed: DevicesFrame | None = None

    def publish(self, frame: DevicesFrame) -> None:
        self.frames.append(frame)

    def close(self, frame: DevicesFrame) -> None:
        self.closed = frame


def test_devices_samples_every_gpu_and_publishes(gpus: list[FakeGpu]) -> None:
    watch = nbmonitor.devices(interval=0.05)
    view = Recorder()
    watch.add_view(view)
    try:
        wait_for(lambda: len(view.frames) >= 3)
        frame = view.frames[-1]
        assert [g["util_percent"] for g in frame.frame.devices] == [0.0, 30.0]
        assert frame.frame.latest["gpu1_util_percent"] == 30.0
        assert [p.pid for p in frame.processes[0]] == [1]
        assert len(frame.history["time"]) >= 3
        assert frame.history["time"][-1] >= frame.history["time"][0]
        assert frame.frame.status == "running"
        gpus[1].util = 55
        wait_for(lambda: view.frames[-1].frame.latest["gpu1_util_percent"] == 55.0)
    finally:
        watch.close()
    assert watch.status == "closed"
    assert view.closed is not None and view.closed.frame.status == "closed"


def test_device_rules_alert_once_per_episode(gpus: list[FakeGpu]) -> None:
    gpus[0].temperature = 92
    gpus[1].mem_used = gpus[1].mem_total - 2**20
    watch = DeviceWatch(interval=0.05, thresholds=Thresholds(rearm_steps=3)).start()
    try:
        wait_for(
            lambda: (
                {a.rule for a in watch.frame().frame.alerts} >= {"gpu_temperature", "device_memory"}
            )
        )
        alerts = watch.frame().frame.alerts
        assert [a.subject for a in alerts if a.rule == "gpu_temperature"] == ["gpu0"]
        assert [a.subject for a in alerts if a.rule == "device_memory"] == ["gpu1"]
        # Held: not again. Cleared for rearm_steps samples, then held again: a second alert.
        watch.flush()
        assert sum(a.rule == "gpu_temperature" for a in watch.frame().frame.alerts) == 1
        gpus[0].temperature = 60
        for _ in range(5):
            assert watch.flush()
        assert sum(a.rule == "gpu_temperature" for a in watch.frame().frame.alerts) == 1
        gpus[0].temperature = 95
        assert watch.flush()
        assert sum(a.rule == "gpu_temperature" for a in watch.frame().frame.alerts) == 2
    finally:
        watch.close()


def test_no_idle_alert_without_a_run(gpus: list[FakeGpu]) -> None:
    gpus[0].util = 0
    watch = DeviceWatch(interval=0.02).start()
    try:
        wait_for(lambda: len(watch.history().get("time", ())) >= 40)
        assert not [a for a in watch.frame().frame.alerts if a.rule == "gpu_idle"]
    finally:
        watch.close()


def test_run_dir_records_a_run_that_opens_and_replays(tmp_path: Path, gpus: list[FakeGpu]) -> None:
    gpus[0].temperature = 95
    watch = nbmonitor.devices(interval=0.05, run_dir=tmp_path, name="box")
    try:
        wait_for(lambda: len(watch.history().get("time", ())) >= 5)
    finally:
        watch.close()
    assert watch.run_dir is not None and watch.run_dir.parent == tmp_path
    assert watch.run_dir.name.endswith("-box")
    meta = json.loads((watch.run_dir / "meta.json").read_text())
    assert meta["kind"] == "devices" and meta["status"] == "closed"
    assert meta["backend"]["devices"] == ["NVIDIA H100 80GB HBM3"] * 2
    run = nbmonitor.open(watch.run_dir)
    system = run.system()
    assert len(system["time"]) >= 5 and np_all_equal(system["gpu0_temperature_c"], 95.0)
    # The step column counts the samples.
    assert list(system["step"][:3]) == [0.0, 1.0, 2.0]
    assert [e["rule"] for e in run.events()] == ["gpu_temperature"]
    assert run.status == "closed"
    assert [r["name"] for r in nbmonitor.list_runs(tmp_path)] == [watch.run_dir.name]


def np_all_equal(values: object, expected: float) -> bool:
    return all(v == expected for v in values)  # type: ignore[attr-defined]


def test_calling_devices_again_closes_the_earlier_watch() -> None:
    first = nbmonitor.devices(interval=0.05)
    second = nbmonitor.devices(interval=0.05)
    try:
        assert first.status == "closed" and second.status == "running"
    finally:
        second.close()


def test_bad_arguments_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="interval must be > 0"):
        nbmonitor.devices(interval=0)
    with pytest.raises(TypeError, match="interval must be a number of seconds"):
        nbmonitor.devices(interval="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Thresholds"):
        nbmonitor.devices(thresholds={"temperature_c": 80})  # type: ignore[arg-type]
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(nbmonitor.RunDirError, match="cannot write to run_dir"):
        nbmonitor.devices(run_dir=blocked)


def test_close_is_idempotent_and_frees_nvml(nvml: FakeNvml) -> None:
    watch = nbmonitor.devices(interval=0.05)
    watch.close()
    watch.close()
    assert nvml.initialised == 0


def test_close_does_not_wait_for_a_hung_device(tmp_path: Path, nvml: FakeNvml) -> None:
    # The watch runs the session core (_engine/session.py): a sample that hangs (a GPU whose
    # driver stopped answering) is named in the status, and close() returns while it still
    # hangs, the run folder closed and saying so; the backend is closed once the call returns.
    release = threading.Event()
    watch = DeviceWatch(interval=0.05, run_dir=tmp_path)
    sample = watch.backend.sample

    def hung() -> dict[str, float]:
        release.wait(300.0)
        return sample()

    watch.backend.sample = hung  # type: ignore[method-assign]
    try:
        watch.start()
        wait_for(lambda: watch.status.startswith("degraded: system sampling hung for"))
        watch.close()
        assert not release.is_set() and watch.status == "closed"
        assert watch.run_dir is not None
        meta = json.loads((watch.run_dir / "meta.json").read_text())
        assert meta["status"] == "degraded" and meta["steps"] == 0
        assert any("sample: TimeoutError" in e for e in meta["errors"])
        assert nvml.initialised == 1  # not closed under a call in progress
    finally:
        release.set()
    wait_for(lambda: nvml.initialised == 0)


def test_panel_state_is_json_with_grades(gpus: list[FakeGpu]) -> None:
    gpus[0].temperature = 80  # within 10 °C of the 85 °C threshold: a warning colour
    gpus[1].clocks_event_reasons = 0x004  # the power cap: a warning colour, not an alert
    watch = DeviceWatch(interval=0.05).start()
    try:
        wait_for(lambda: len(watch.history().get("time", ())) >= 2)
        state = panel_state(watch.frame())
        panel = watch.panel()
        assert isinstance(panel, DevicesDashboard) and panel.widget.state["gpus"]
    finally:
        watch.close()
    text = json.dumps(state, allow_nan=False)  # NaN went out as null
    assert len(text) < 20_000
    g0, g1 = state["gpus"]  # type: ignore[misc]
    assert g0["grades"]["temperature_c"] == "warn" and g1["grades"]["throttle"] == "warn"
    assert g0["processes"] == [{"pid": 1, "name": g0["processes"][0]["name"], "used_bytes": 2**30}]
    assert len(g0["spark"]["util_percent"]) >= 2
    assert state["machine"]["ram_total_bytes"] > 0  # type: ignore[index]
    assert not math.isnan(state["interval"])  # type: ignore[arg-type]


def test_devices_imports_no_torch(tmp_path: Path) -> None:
    code = (
        "import sys, nbmonitor; w = nbmonitor.devices(interval=0.05, run_dir=sys.argv[1]); "
        "w.flush(); w.close(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
