"""notebooks/07-devices.ipynb in a real JupyterLab and a headless Chromium: the panel of
nbmonitor.devices() renders (the machine card; a card per GPU where NVML sees one) and updates
between two screenshots, then shows the watch closed."""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import pytest
from tests.ui.test_browser import (
    ARTIFACTS,
    assert_console_clean,
    jupyter_server,
    open_and_run_all,
    open_page,
    start_browser_test,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "07-devices.ipynb"


def _elapsed(page: object) -> float:
    text = page.locator(".nbm-dev .nbm-dev-elapsed").first.inner_text()  # type: ignore[attr-defined]
    match = re.match(r"([\d.]+) s", text)
    return float(match.group(1)) if match else -1.0


@pytest.mark.timeout(420)
def test_devices_panel_renders_and_updates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sync_api = start_browser_test("devices-1.png", "devices-2.png", "devices-failure.png")
    # The panel is live this long after its cell runs: the test must see it running before
    # then, however slowly JupyterLab renders on a loaded machine.
    monkeypatch.setenv("NBMONITOR_DEVICES_SECONDS", "60")
    console_errors: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", NOTEBOOK) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console_errors)
        try:
            open_and_run_all(page, f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_selector(".nbm-dev .nbm-dev-machine", timeout=120_000)
            page.wait_for_function(
                "() => document.querySelector('.nbm-dev-status')?.textContent"
                ".startsWith('running')",
                timeout=120_000,
            )
            panel = page.locator(".jp-OutputArea-output:has(.nbm-dev)").first
            panel.scroll_into_view_if_needed()
            first, shot1 = _elapsed(page), panel.screenshot(path=str(ARTIFACTS / "devices-1.png"))
            page.wait_for_function(
                f"() => parseFloat(document.querySelector('.nbm-dev-elapsed').textContent)"
                f" > {first + 2}",
                timeout=60_000,
            )
            second, shot2 = _elapsed(page), panel.screenshot(path=str(ARTIFACTS / "devices-2.png"))
            assert 0 <= first < second, (first, second)
            assert shot1 != shot2  # the panel was redrawn with new numbers
            machine = page.locator(".nbm-dev-machine").first.inner_text()
            assert "CPU" in machine and "RAM" in machine and "GiB" in machine
            # A sparkline of the machine's CPU has been drawn from several samples.
            points = page.evaluate(
                "() => document.querySelector('.nbm-dev-machine polyline')"
                "?.getAttribute('points')?.split(' ').length ?? 0"
            )
            assert points >= 2, points
            gpus = page.locator(".nbm-dev-card[data-gpu]").count()
            notes = page.locator(".nbm-dev-notes").first.inner_text()
            assert gpus > 0 or "GPU" in notes or "nvidia-ml-py" in notes, notes
            # The notebook closes the watch: the panel says so.
            page.wait_for_function(
                "() => document.querySelector('.nbm-dev-status')?.textContent.startsWith('closed')",
                timeout=180_000,
            )
            body = page.evaluate("() => document.body.textContent")
            assert "Error displaying widget" not in body and "Traceback" not in body
            assert_console_clean(console_errors)
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "devices-failure.png"), full_page=True)
            shutil.copy(log, ARTIFACTS / "devices-jupyter.log")
            raise
        finally:
            browser.close()
