"""The main-thread route (Colab): widget updates are sent from the kernel's main thread only,
by the training loop at step boundaries while a long cell runs, and by the kernel's event loop
while the main thread is idle."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.ui.test_dashboard import make_frame

from nbmonitor.ui.dashboard import Dashboard
from nbmonitor.ui.delivery import MainThreadRoute, choose_route

ROOT = Path(__file__).resolve().parents[2]


def test_the_route_is_main_on_colab_and_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NBMONITOR_PUBLISH", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    assert choose_route() == "thread"
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    assert choose_route() == "main"
    monkeypatch.setenv("NBMONITOR_PUBLISH", "thread")
    assert choose_route() == "thread"
    monkeypatch.setenv("NBMONITOR_PUBLISH", "MAIN ")
    assert choose_route() == "main"


def in_thread(fn: Any) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def test_updates_from_other_threads_wait_for_the_main_thread_newest_first() -> None:
    route = MainThreadRoute()
    sent: list[tuple[int, bool]] = []

    def on_main(i: int) -> Any:
        return lambda: sent.append((i, threading.current_thread() is threading.main_thread()))

    in_thread(lambda: route.offer(on_main(1)))
    in_thread(lambda: route.offer(on_main(2)))
    assert sent == [] and route.pending
    in_thread(route.pump)  # not the main thread: nothing sent
    assert sent == []
    route.pump()
    assert sent == [(2, True)] and not route.pending and route.sent_on_main == 1
    route.pump()  # nothing waiting: nothing sent
    assert route.sent_on_main == 1
    route.offer(on_main(3))  # from the main thread: sent at once
    assert sent[-1] == (3, True)


def test_the_final_update_is_not_replaced_by_a_late_one() -> None:
    route = MainThreadRoute()
    sent: list[str] = []
    in_thread(lambda: route.offer(lambda: sent.append("close"), final=True))
    in_thread(lambda: route.offer(lambda: sent.append("late publish")))
    route.pump()
    assert sent == ["close"]


def test_a_failing_send_never_reaches_the_training_loop() -> None:
    route = MainThreadRoute()

    def boom() -> None:
        raise RuntimeError("comm closed")

    in_thread(lambda: route.offer(boom))
    route.pump()  # no exception
    assert not route.pending


def test_the_dashboard_on_the_main_route_publishes_only_when_pumped() -> None:
    dash = Dashboard("r", "cpu", None, route="main")
    in_thread(lambda: dash.publish(make_frame(10)))
    in_thread(lambda: dash.publish(make_frame(11)))
    assert dash.publishes == 0 and dash.widget.header["step"] == 0
    dash.pump()
    assert dash.publishes == 1 and dash.widget.header["step"] == 11
    in_thread(lambda: dash.close(make_frame(12)))
    assert not dash.closed
    dash.pump()
    assert dash.closed and dash.widget.header["status"] == "closed"
    assert dash.sent_on_main == 2


# A long training cell on the main route: every comm message the widgets send is recorded with
# its thread; the loop sleeps so the sampler publishes several times while the cell runs.
CELLS = [
    """
import threading, time
import ipywidgets, torch
from torch import nn
import nbmonitor

SENDS = []
_send = ipywidgets.Widget._send
def _recording_send(self, msg, buffers=None):
    SENDS.append((threading.current_thread().name, msg.get("method"), time.monotonic()))
    return _send(self, msg, buffers)
ipywidgets.Widget._send = _recording_send

model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, total_steps=40, interval=0.2)
dash = mon.dashboard()
""",
    """
start = time.monotonic()
steps = 0
def sent_during():
    return [s for s in SENDS if s[2] >= start and s[1] == "update"]
# A busy main thread: at least 40 steps of 0.1 s in one cell, and on until the dashboard has
# sent three updates during it (a condition, bounded: a loaded machine ticks less often).
while steps < 40 or (len(sent_during()) < 3 and time.monotonic() < start + 180):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    mon.log(loss=loss)
    steps += 1
    time.sleep(0.1)
during = sent_during()
seen_step = dash.widget.header["step"]
""",
    """
mon.close()
import json
print(json.dumps({
    "route": dash.route,
    "during": len(during),
    "threads": sorted({s[0] for s in SENDS}),
    "seen_step": seen_step,
    "sent_on_main": dash.sent_on_main,
    "status": dash.widget.header["status"],
    "step": dash.widget.header["step"],
    "steps": steps,
}))
""",
]


@pytest.mark.slow
def run_cells(cells: list[str], workdir: Path, route: str, timeout: int) -> dict[str, Any]:
    """Run ``cells`` in a real kernel (cwd ``workdir``) with ``NBMONITOR_PUBLISH=route``; the
    JSON report the last cell prints last."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    env = {
        "NBMONITOR_PUBLISH": route,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    report: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    assert report["route"] == route
    return report


@pytest.mark.timeout(300)
def test_a_long_cell_publishes_from_the_main_thread(tmp_path: Path) -> None:
    report = run_cells(CELLS, tmp_path, "main", timeout=240)
    assert report["route"] == "main"
    # Every widget message came from the main thread, none from the sampler...
    assert report["threads"] == ["MainThread"], report
    # ...and the dashboard moved while the long cell kept the main thread busy.
    assert report["during"] >= 3, report
    assert 0 < report["seen_step"] <= report["steps"], report
    assert report["status"] == "closed" and report["step"] == report["steps"], report
    assert report["sent_on_main"] >= 3, report
