"""notebooks/09-marimo.py in marimo (``marimo run``, headless, on 127.0.0.1) and Debian's
chromium: the dashboard, an anywidget, renders in marimo, whether the cell shows
``mon.dashboard()`` or ``mon`` itself, its loss chart is drawn and changes while the training
cell runs, and the browser logs no errors or warnings."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from tests.ui.test_browser import (
    _INK_JS,
    ARTIFACTS,
    LOSS_CANVAS,
    _free_port,
    _step,
    assert_console_clean,
    chart_png,
    open_page,
    start_browser_test,
    wait_for_progress,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "09-marimo.py"
STEPS = 6000  # long enough to read the dashboard twice while the loop runs


# The dashboard cell's last expression: the dashboard asked for, or the monitor itself (as in
# Jupyter, where ``mon`` last in a cell shows the dashboard: marimo's ``_display_``).
SHOWN = "    mon.dashboard()\n    return\n"


@pytest.mark.timeout(420)
@pytest.mark.parametrize("shown", ["mon.dashboard()", "mon"])
def test_the_dashboard_draws_and_updates_in_marimo(tmp_path: Path, shown: str) -> None:
    if not _has_marimo():
        if os.environ.get("CI"):
            pytest.fail("marimo is not installed (the test extra pins it)")
        pytest.skip("marimo is not installed")
    sync_api = start_browser_test("marimo.png", "marimo-failure.png", "marimo-console.log")
    source = (ROOT / "notebooks" / NOTEBOOK).read_text()
    assert SHOWN in source, "the notebook's dashboard cell changed: update SHOWN"
    (tmp_path / NOTEBOOK).write_text(source.replace(SHOWN, f"    {shown}\n    return\n"))
    port = _free_port()
    env = dict(os.environ, NBMONITOR_QUICKSTART_STEPS=str(STEPS))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    log = tmp_path / "marimo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "marimo", "run", NOTEBOOK, "--headless",
                "--host", "127.0.0.1", "--port", str(port), "--no-token",
            ],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    console: list[str] = []
    try:
        base = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(base, timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"marimo did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        with sync_api.sync_playwright() as p:
            browser, page = open_page(p, console, viewport=(1280, 800))
            try:
                page.goto(base, wait_until="domcontentloaded", timeout=120_000)
                # Locators reach into marimo's shadow roots, where the widget lives.
                page.locator(".nbm-root [data-field=step]").first.wait_for(timeout=180_000)
                canvas = page.locator(LOSS_CANVAS).first
                canvas.wait_for(timeout=180_000)
                deadline = time.monotonic() + 180
                while not canvas.evaluate(_INK_JS) and time.monotonic() < deadline:
                    page.wait_for_timeout(500)
                assert canvas.evaluate(_INK_JS), "the loss chart was not drawn"
                step1, png1 = _step(page), chart_png(page)
                step2, png2 = wait_for_progress(page, step1, png1)
                reads = f"step {step1} -> {step2}"
                assert 0 < step1 < step2 < STEPS, reads
                assert png1 != png2, f"the loss chart did not change ({reads})"
                assert page.locator(".nbm-root .nbm-tab[data-tab=training]").count() == 1
                assert_console_clean(console)
                page.screenshot(path=str(ARTIFACTS / "marimo.png"))
            except BaseException:
                page.screenshot(path=str(ARTIFACTS / "marimo-failure.png"), full_page=True)
                (ARTIFACTS / "marimo-console.log").write_text("\n".join(console))
                shutil.copy(log, ARTIFACTS / "marimo.log")
                raise
            finally:
                browser.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _has_marimo() -> bool:
    import importlib.util

    return importlib.util.find_spec("marimo") is not None
