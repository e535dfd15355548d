"""nbmonitor top's steering keys: p pause, u resume, c checkpoint, x then y stop, acting on the
run open (or selected) through the ``steer`` callable the composition root gives; only on a
running run, and a stop only once confirmed."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

pytest.importorskip("textual")

from nbmonitor._engine.frame import DevicesFrame
from nbmonitor.runs.watch import RunDetail, RunRow
from nbmonitor.ui.tui.app import TopApp


def row(name: str, status: str) -> RunRow:
    nan = math.nan
    return RunRow(name, f"/runs/{name}", status, 7, 100, 0.5, nan, nan, nan, nan, 0, "")


class Source:
    interval = 0.2

    def __init__(self, rows: Sequence[RunRow]) -> None:
        self.rows = list(rows)

    def devices(self) -> DevicesFrame | None:
        return None

    def runs(self) -> Sequence[RunRow]:
        return self.rows

    def detail(self, path: str) -> RunDetail | None:
        return next((RunDetail(r) for r in self.rows if r.path == path), None)


def drive(app: TopApp, script: Callable[[object], Awaitable[None]]) -> None:
    async def main() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await script(pilot)

    asyncio.run(main())


def test_keys_ask_the_selected_running_run() -> None:
    asked: list[tuple[str, str]] = []

    def steer(path: str, kind: str) -> str:
        asked.append((path, kind))
        return f"asked {path} to {kind}"

    app = TopApp(Source([row("live", "running"), row("done", "closed")]), steer=steer)

    async def script(pilot: object) -> None:
        press = pilot.press  # type: ignore[attr-defined]
        await press("p", "u", "c")
        assert asked == [
            ("/runs/live", "pause"),
            ("/runs/live", "resume"),
            ("/runs/live", "checkpoint"),
        ]
        await press("x")  # asks first
        assert len(asked) == 3 and app.said[-1].startswith("stop live after")
        await press("p")  # another key: the stop is not confirmed
        await press("y")
        assert asked[-1] == ("/runs/live", "pause")
        await press("x", "y")
        assert asked[-1] == ("/runs/live", "stop")
        # The closed run: nothing asked, one line why.
        await press("down", "p")
        assert asked[-1] == ("/runs/live", "stop") and len(asked) == 5
        assert app.said[-1] == "done is not running (closed)"
        # In the open run's view, its keys act on it.
        await press("up", "enter", "c")
        assert asked[-1] == ("/runs/live", "checkpoint")

    drive(app, script)


def test_without_a_steer_callable_the_keys_say_so() -> None:
    app = TopApp(Source([row("live", "running")]))

    async def script(pilot: object) -> None:
        await pilot.press("p")  # type: ignore[attr-defined]
        assert app.said == ["steering is not available here"]

    drive(app, script)


def test_a_failing_request_is_one_line_not_a_crash() -> None:
    def steer(path: str, kind: str) -> str:
        raise PermissionError("control folder not writable")

    app = TopApp(Source([row("live", "running")]), steer=steer)

    async def script(pilot: object) -> None:
        await pilot.press("c")  # type: ignore[attr-defined]
        assert app.said == ["live: checkpoint not asked: control folder not writable"]

    drive(app, script)


def test_steer_run_writes_the_request_the_run_reads(tmp_path: Path) -> None:
    from nbmonitor.machine.top import steer_run
    from nbmonitor.runs.control import ControlReader, ControlRequest, make_control_dir

    make_control_dir(tmp_path)
    reader = ControlReader(tmp_path)
    assert (
        steer_run(str(tmp_path), "pause")
        == f"asked {tmp_path.name} to pause at the end of its next step"
    )
    got = reader.poll()
    assert len(got) == 1 and isinstance(got[0], ControlRequest)
    assert (got[0].kind, got[0].source) == ("pause", "tui")


def test_steer_run_on_a_folder_without_control_says_so(tmp_path: Path) -> None:
    from nbmonitor.machine.top import steer_run

    with pytest.raises(OSError, match="takes no requests"):
        steer_run(str(tmp_path), "stop")
