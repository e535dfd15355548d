"""Steering a run from its dashboard in a real front end (JupyterLab 4, Notebook 7) and Debian's
chromium: the buttons pause the loop (its step stops advancing while the dashboard stays live),
set the learning rate (the lr chart marks it, and the optimizer has it), save a checkpoint
(it loads, and a new run resumes from its step), resume, and stop (the cell ends without a
traceback, the run is ``stopped``, its steps on disk contiguous); for a loop running in the
cell's main thread (the kernel busy: the buttons' messages must get past it) and for one in a
background thread. Counts and orders only, with generous bounds: a loaded machine is slow.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import nbformat
import pytest
from tests.ui.test_browser import (
    ARTIFACTS,
    IDLE,
    _step,
    assert_console_clean,
    goto_notebook,
    jupyter_server,
    open_page,
    start_browser_test,
    wait_for_live_step,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# What a kernel connection that lost the race with the kernel's start logs on a loaded machine
# (the server answers the first websocket with a 500, the front end reconnects): no cell, no
# widget of ours causes it.
STARTUP_NOISE = re.compile(
    r"warning: WebSocket connection to 'ws://127\.0\.0\.1:\d+/api/kernels/[\w-]+/channels\?"
    r"session_id=[\w-]+' failed: WebSocket is closed before the connection is established\."
    r"|warning: History was unable to be retrieved"
    r"|error: Could not restore the debugger state: Canceled future for debug_request message"
    r" before replies were done"
)
LR = 0.025  # the learning rate typed into the bar (the run starts at 0.1)
WAIT_MS = 180_000  # a bound on waiting for the run, never a pause

SETUP = """\
import glob, threading, time
import numpy as np, torch, nbmonitor
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon = nbmonitor.attach(model, opt, run_dir="runs", interval=0.25)

def train(n=2_000_000):
    for i in range(n):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.002)  # a few hundred steps a second, whatever the machine
"""

MAIN_LOOP = "train()\nprint('the loop ended by itself')\n"
THREAD_LOOP = "worker = threading.Thread(target=train, name='training')\nworker.start()\n"

REPORT = """\
run = nbmonitor.open(mon.run_dir)
steps = run.history()["step"]
ckpts = sorted(glob.glob(str(mon.run_dir / "checkpoints" / "*.pt")))
ck = torch.load(ckpts[0])
model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
model2.load_state_dict(ck["model"]); opt2.load_state_dict(ck["optimizer"])
with nbmonitor.attach(model2, opt2, run_dir="runs", start_step=ck["step"], display=False) as mon2:
    model2(torch.randn(16, 8)).pow(2).mean().backward(); opt2.step()
    resumed = mon2.step
print("REPORT " + json.dumps({
    "status": run.status, "first": int(steps[0]), "last": int(steps[-1]),
    "contiguous": bool(np.all(np.diff(steps) == 1)), "checkpoints": len(ckpts),
    "ckpt_step": ck["step"], "ckpt_keys": sorted(ck), "resumed": resumed,
    "ckpt_lr": ck["optimizer"]["param_groups"][0]["lr"], "lr": opt.param_groups[0]["lr"],
    "threads": [t.name for t in threading.enumerate() if t.name == "training"],
}))
"""


def write_notebook(folder: Path, loop: str) -> Path:
    cells = [SETUP, loop, "import json\n" + REPORT]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = folder / "steering.ipynb"
    nbformat.write(nb, path)
    return path


def bar(page: Any) -> str:
    return str(page.locator(".nbm-root [data-field=steer]").first.inner_text())


def click(page: Any, action: str) -> None:
    page.locator(f".nbm-root [data-steer={action}]").first.click()


def wait_text(page: Any, pattern: str) -> re.Match[str]:
    """Wait for the steering bar to read ``pattern``; its match."""
    page.wait_for_function(
        "(p) => new RegExp(p).test(document.querySelector('.nbm-root [data-field=steer]')"
        "?.textContent ?? '')",
        arg=pattern,
        timeout=WAIT_MS,
    )
    found = re.search(pattern, bar(page))
    assert found is not None, bar(page)
    return found


def publishes(page: Any, count: int) -> None:
    """Wait for ``count`` more updates of the dashboard (its elapsed time moving on)."""
    for _ in range(count):
        before = page.locator(".nbm-root [data-field=elapsed]").first.inner_text()
        page.wait_for_function(
            "(b) => document.querySelector('.nbm-root [data-field=elapsed]')?.textContent !== b",
            arg=before,
            timeout=WAIT_MS,
        )


def report(page: Any) -> dict[str, Any]:
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".some(o => o.textContent.includes('REPORT '))",
        timeout=WAIT_MS,
    )
    text = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    line = next(x for x in text.splitlines() if x.startswith("REPORT "))
    return dict(json.loads(line.removeprefix("REPORT ")))


def _count(text: str) -> int:
    """A step as the bar writes it: "1,040" past a thousand."""
    return int(text.replace(",", ""))


def steer_the_run(page: Any) -> tuple[int, int]:
    """Pause, set the lr and checkpoint while paused, resume, stop; (paused step, stop step)."""
    wait_for_live_step(page)
    wait_text(page, "^$")  # running: the bar says nothing
    click(page, "pause")
    paused = _count(wait_text(page, r"paused at step ([\d,]+)").group(1))
    publishes(page, 3)  # the dashboard stays live while the loop waits
    assert _step(page) == paused, "the step advanced while paused"

    page.locator(".nbm-root [data-field=lr-input]").first.fill(str(LR))
    click(page, "lr")
    page.wait_for_selector(".nbm-root [data-chart=lr][data-marks='1']", timeout=WAIT_MS)
    title = page.locator(".nbm-root [data-chart=lr] .nbm-chart-title").first.get_attribute("title")
    # The chart writes the step in SI, six digits (js/src/format.js si): 1040 is "1.04k".
    at = f"{paused / 1000:.6g}k" if paused >= 1000 else str(paused)
    assert f"set to {LR:g} at step {at}" in (title or ""), title
    click(page, "checkpoint")
    publishes(page, 2)
    assert _step(page) == paused

    click(page, "resume")
    page.wait_for_function(
        "(n) => parseInt(document.querySelector('.nbm-root [data-field=step]')"
        "?.textContent.replace(/,/g, '')) > n + 5",
        arg=paused,
        timeout=WAIT_MS,
    )
    # The lr chart's newest point is the lr asked.
    legend = page.locator(".nbm-root [data-chart=lr] .u-legend").first.inner_text()
    assert f"{LR:g}" in legend, legend

    click(page, "stop")  # asks first
    assert page.locator(".nbm-root [data-steer=confirm-stop]").first.is_visible()
    click(page, "confirm-stop")
    stopped = _count(wait_text(page, r"stopped at step ([\d,]+)").group(1))
    return paused, stopped


def check_report(got: dict[str, Any], paused: int, stopped: int) -> None:
    assert got["status"] == "stopped", got
    assert got["first"] == 1 and got["last"] == stopped and got["contiguous"], got
    # One checkpoint, taken while paused: the step the loop waited at.
    assert got["checkpoints"] == 1 and got["ckpt_step"] == paused, got
    assert got["ckpt_keys"] == ["model", "optimizer", "step"], got
    assert got["resumed"] == paused + 1, got
    assert got["lr"] == LR and got["ckpt_lr"] == LR, got  # the chart and the optimizer agree
    assert got["threads"] == [], got  # a loop in a thread ended


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("app", "loop"),
    [("lab", "main"), ("notebook", "main"), ("lab", "thread")],
)
def test_steer_from_the_dashboard(tmp_path: Path, app: str, loop: str) -> None:
    name = f"steer-{app}-{loop}"
    sync_api = start_browser_test(f"{name}.png", f"{name}-failure.png", f"{name}.log")
    source = write_notebook(tmp_path, MAIN_LOOP if loop == "main" else THREAD_LOOP)
    console: list[str] = []
    with (
        jupyter_server(tmp_path, app, source) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console, viewport=(1400, 1600))
        try:
            where = "lab/tree" if app == "lab" else "notebooks"
            open_ready(page, f"{base}/{where}/{source.name}?token={token}")
            start_cells(page, loop)
            # The report cell: queued behind a main-thread loop, it runs once the stop ends it;
            # after a loop in a thread, it is run now.
            paused, stopped = steer_the_run(page)
            if loop != "main":
                page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").last.click()
                page.keyboard.press("Shift+Enter")
            got = report(page)
            check_report(got, paused, stopped)
            text = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
            assert "Traceback" not in text and "Error displaying" not in text, text[-3000:]
            if loop == "main":
                assert f"training stopped at step {stopped}" in text, text[-3000:]
                assert "the loop ended by itself" not in text
            page.wait_for_selector(IDLE, timeout=WAIT_MS)
            assert_console_clean([e for e in console if not STARTUP_NOISE.fullmatch(e)])
            page.locator(".jp-OutputArea-output:has(.nbm-root)").first.screenshot(
                path=str(ARTIFACTS / f"{name}.png")
            )
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"), full_page=True)
            (ARTIFACTS / f"{name}.log").write_text("\n".join(console))
            shutil.copy(log, ARTIFACTS / f"{name}-jupyter.log")
            raise
        finally:
            browser.close()


_RAN_JS = """(i) => /\\[\\d+\\]/.test(document.querySelectorAll(
  '.jp-Notebook .jp-CodeCell .jp-InputPrompt')[i]?.textContent ?? '')"""
# How long the setup cell may take to show the dashboard before the start is taken for lost.
START_WAIT_MS = 90_000


def open_ready(page: Any, url: str, attempts: int = 3) -> None:
    """Open the notebook and wait for its kernel to be connected and idle. The server can
    answer the page's first kernel connection with an error while the kernel starts (a race
    on a loaded machine) and the page may then never connect: it is loaded again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    goto_notebook(page, url)
    for attempt in range(attempts):
        try:
            page.wait_for_selector(IDLE, timeout=START_WAIT_MS)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise
            page.reload(wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)


def start_cells(page: Any, loop: str, attempts: int = 3) -> None:
    """Run the setup, then the loop's cell; with a loop in the main thread, queue the report
    behind it too (it runs once the stop ends the loop); with one in a thread, the main thread
    is left idle. One cell at a time (Notebook 7's Run All can drop cells while it starts). A
    kernel connection that lost the race with the kernel's start on a loaded machine can drop
    the setup's request: nothing runs and the kernel stays idle; the page is then loaded again
    and the setup run again (never while the kernel is busy)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    prompts = page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt")

    def run(index: int) -> None:
        prompts.nth(index).click()
        page.keyboard.press("Control+Enter")

    for attempt in range(attempts):
        try:
            run(0)
            page.wait_for_selector(".nbm-root", timeout=START_WAIT_MS)
            break
        except PlaywrightTimeout:
            # The kernel idle while the setup has not shown the dashboard: the request was
            # lost (its prompt may still say queued, "[*]"). A busy kernel is still working.
            if attempt == attempts - 1 or not page.locator(IDLE).count():
                raise
            page.reload(wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector(IDLE, timeout=120_000)
    page.wait_for_function(_RAN_JS, arg=0, timeout=WAIT_MS)
    run(1)
    if loop == "main":
        wait_for_live_step(page)
        run(2)
    else:
        page.wait_for_function(_RAN_JS, arg=1, timeout=WAIT_MS)
