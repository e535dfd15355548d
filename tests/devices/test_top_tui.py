"""nbmonitor top: the Textual app driven headless by its own pilot (App.run_test), against fake
NVML devices and runs written by another process; --once and nbmonitor tail RUN --tui."""

from __future__ import annotations

import asyncio
import html
import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from fake_pynvml import FakeGpu, FakeNvml

pytest.importorskip("textual")

from nbmonitor.machine.top import TopFeed, top
from nbmonitor.machine.watch import close_all
from nbmonitor.runs.watch import RunsWatch
from nbmonitor.ui.tui.app import TopApp

WRITER = Path(__file__).with_name("run_writer.py")


@pytest.fixture
def gpus() -> list[FakeGpu]:
    return [
        FakeGpu("GPU-0", temperature=91, processes=[(os.getpid(), 3 * 2**30)]),
        FakeGpu("GPU-1", util=5),
    ]


@pytest.fixture(autouse=True)
def nvml(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu]) -> Iterator[FakeNvml]:
    fake = FakeNvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake
    close_all()


def start_writer(root: Path, name: str, steps: int, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(root), name, str(steps), *extra],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    return proc


def screen_text(app: TopApp) -> str:
    """The screen as text (from the app's own screenshot)."""
    svg = app.export_screenshot()
    body = svg[svg.find("<g") :]
    return html.unescape(re.sub(r"<[^>]+>", "", body)).replace("\xa0", " ")


async def until(pilot: object, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)  # type: ignore[attr-defined]


def drive(app: TopApp, size: tuple[int, int], script: Callable[[object], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await script(pilot)

    asyncio.run(main())


def test_devices_runs_live_step_and_keys(tmp_path: Path) -> None:
    runs, saves = tmp_path / "runs", tmp_path / "saves"
    runs.mkdir()
    (runs / "hold").touch()
    old = start_writer(runs, "old", 20, "--total", "20")
    old.communicate(timeout=120)
    live = start_writer(runs, "live", 400, "--total", "1000", "--delay", "0.02", "--hold")
    live_path = Path(live.stdout.readline().strip())  # type: ignore[union-attr]
    live.stdout.close()  # type: ignore[union-attr]
    feed = TopFeed(RunsWatch(runs, rescan_s=0.2), 0.2)
    app = TopApp(feed, save_dir=saves)

    def live_step() -> int:
        return next((r.step for r in app.rows if r.path == str(live_path)), -1)

    async def script(pilot: object) -> None:
        await until(pilot, lambda: app.frame is not None and live_step() > 0)
        first = live_step()
        await until(pilot, lambda: live_step() > first + 5)  # it follows the live step
        text = screen_text(app)
        assert "H100 80GB HBM3" in text and "91C" in text
        assert "live" in text and "running" in text and "old" in text and "closed" in text
        assert f"{live_step()}/1000" in text or "/1000" in text
        assert "GPU 0 is at 91" in text  # the device rule's alert
        assert "python" in text  # the process on GPU 0, by name

        await pilot.press("s")  # type: ignore[attr-defined]
        await until(pilot, lambda: len(app.saved) == 2)
        txt, csv = app.saved
        assert "Devices" in txt.read_text() and live_path.name in txt.read_text()
        header = csv.read_text().splitlines()[0].split(",")
        assert header[:2] == ["time", "step"] and "gpu0_temperature_c" in header

        await pilot.press("r")  # type: ignore[attr-defined]
        assert app.since > 0

        await pilot.press("slash", "o", "l", "d", "enter")  # type: ignore[attr-defined]
        await until(pilot, lambda: len(app.shown_runs()) == 1)
        await pilot.press("enter")  # type: ignore[attr-defined]
        await until(pilot, lambda: app.detail is not None)
        assert app.selected is not None and app.selected.endswith("-old")
        text = screen_text(app)
        assert "loss" in text and "grad norm" in text and "loss spiked at 3" in text
        await pilot.press("escape")  # type: ignore[attr-defined]
        assert app.selected is None

        await pilot.press("slash", "backspace", "backspace", "backspace", "enter")  # type: ignore[attr-defined]
        await until(pilot, lambda: len(app.shown_runs()) == 2)
        assert app.cursor == 0
        await pilot.press("down")  # type: ignore[attr-defined]
        assert app.cursor == 1
        await pilot.press("down")  # type: ignore[attr-defined]
        assert app.cursor == 1  # the last row
        await pilot.press("up", "q")  # type: ignore[attr-defined]
        assert app.cursor == 0

    try:
        drive(app, (250, 70), script)
    finally:
        (runs / "hold").unlink()
        live.wait(120)
        feed.stop()
    assert app.return_code in (0, None) and not app.is_running


@pytest.mark.parametrize("size", [(80, 24), (250, 70)])
def test_small_and_large_terminals(tmp_path: Path, size: tuple[int, int]) -> None:
    feed = TopFeed(RunsWatch(tmp_path), 0.1)
    app = TopApp(feed, save_dir=tmp_path)

    async def script(pilot: object) -> None:
        await until(pilot, lambda: app.frame is not None and "91C" in screen_text(app))
        text = screen_text(app)
        lines = text.splitlines()
        assert "util" in text
        assert ("SM MHz" in text) == (size[0] >= 120)
        assert max(len(line) for line in lines) <= size[0] + 1

    try:
        drive(app, size, script)
    finally:
        feed.stop()


def test_no_color(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    feed = TopFeed(RunsWatch(tmp_path), 0.1, devices=False)
    app = TopApp(feed)
    try:
        drive(app, (80, 24), lambda pilot: until(pilot, lambda: app.refreshes >= 1))
    finally:
        feed.stop()
    assert app.no_color


def test_once_prints_the_tables_when_not_a_terminal(tmp_path: Path) -> None:
    proc = start_writer(tmp_path, "done", 12)
    proc.communicate(timeout=120)
    out = io.StringIO()
    assert top(str(tmp_path), 0.05, out=out) == 0
    text = out.getvalue()
    assert "H100 80GB HBM3" in text and "91C" in text
    assert "done" in text and "closed" in text and "12" in text
    assert "\x1b[" not in text  # no colour codes


def test_tail_tui_opens_the_run_view(tmp_path: Path) -> None:
    # A run still open (its writer holds it): the view is titled for it, shows the values
    # with their units and the alerts, saves; when the run closes, the app ends by itself.
    (tmp_path / "hold").touch()
    proc = start_writer(tmp_path, "one", 30, "--total", "30", "--hold")
    path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    feed = TopFeed(RunsWatch(path, only=True), 0.1, devices=False)
    app = TopApp(feed, run_path=str(path), save_dir=tmp_path)

    async def script(pilot: object) -> None:
        await until(pilot, lambda: app.detail is not None and app.detail.row.step == 30)
        text = screen_text(app)
        title = text.strip().splitlines()[0]
        assert title.startswith(f"nbmonitor tail · {path.name} · running · step 30/30"), title
        assert "nbmonitor top" not in text
        assert "step time  10 ms" in text and "min 10 ms" in text  # seconds shown in ms
        assert "grad norm" in text and "loss spiked at 3" in text
        await pilot.press("escape", "s")  # type: ignore[attr-defined]
        await until(pilot, lambda: len(app.saved) == 2)
        assert app.saved[1].read_text().splitlines()[0].startswith("step,time,")
        (tmp_path / "hold").unlink()  # the writer closes its run
        await until(pilot, lambda: app.ended is not None)

    try:
        drive(app, (100, 24), script)
    finally:
        feed.stop()
        (tmp_path / "hold").unlink(missing_ok=True)
        proc.communicate(timeout=60)
    assert app.selected == str(path) and app.ended == "closed"
    assert not app.is_running  # ended by itself: no key pressed


def test_tail_tui_on_a_closed_run_draws_it_once_and_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbmonitor.machine.top import tail_tui

    proc = start_writer(tmp_path, "done", 12)
    path = Path(proc.communicate(timeout=120)[0].strip())
    # Returns with no key pressed (a run that never ends would hold it: the test's timeout).
    assert tail_tui(str(path), 0.05, save_dir=str(tmp_path), headless=True) == 0
    assert capsys.readouterr().out.strip() == f"nbmonitor tail: {path.name} closed at step 12"


def test_cli_top_once_and_tail_tui_errors(tmp_path: Path) -> None:
    from nbmonitor.__main__ import main

    assert main(["top", "--once", "--runs", str(tmp_path), "--interval", "0.05"]) == 0
    assert main(["tail", str(tmp_path / "absent"), "--tui"]) == 2


def test_an_idle_gpu_while_a_run_trains_alerts_once(tmp_path: Path, gpus: list[FakeGpu]) -> None:
    (tmp_path / "hold").touch()
    live = start_writer(tmp_path, "busy", 100_000, "--delay", "0.01", "--hold")
    live.stdout.readline()  # type: ignore[union-attr]
    live.stdout.close()  # type: ignore[union-attr]
    gpus[0].util, gpus[1].util = 2, 3  # both idle; only GPU 1 runs the training process
    gpus[1].processes = [(live.pid, 2**30)]
    gpus[0].processes = []
    feed = TopFeed(RunsWatch(tmp_path, rescan_s=0.1), 0.05)
    try:
        deadline = time.monotonic() + 60
        while not feed.idle.alerts:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no idle alert"
            feed.runs()
            feed.devices()
            time.sleep(0.05)
        for _ in range(10):  # it holds: no second alert
            feed.runs()
            frame = feed.devices()
            time.sleep(0.05)
    finally:
        (tmp_path / "hold").unlink()
        live.kill()
        live.wait(60)
        feed.stop()
    idle = [a for a in frame.frame.alerts if a.rule == "gpu_idle"]  # type: ignore[union-attr]
    assert [a.subject for a in idle] == ["gpu1"]
    assert idle[0].message.startswith(f"{next(tmp_path.glob('*-busy')).name}: GPU 1 averaged")
    assert idle[0].step > 0
