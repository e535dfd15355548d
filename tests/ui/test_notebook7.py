"""The quickstart notebook in a real Jupyter Notebook 7 and a real (headless) Chromium.

The same checks as test_browser.py (which drives JupyterLab 4), in the other front end the
project promises to support: the dashboard renders, its step counter grows while the training
cell runs, and the console has no nbmonitor errors. A screenshot is always written to
test-artifacts/notebook7.png, and a full-page one (notebook7-failure.png) on failure.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.ui.test_browser import (
    ARTIFACTS,
    IDLE,
    NOTEBOOK,
    STEPS,
    _step,
    assert_rendered_cleanly,
    chart_ink,
    chart_png,
    goto_notebook,
    interrupt_and_close,
    jupyter_server,
    open_page,
    run_all,
    start_browser_test,
    wait_for_live_step,
    wait_for_progress,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def notebook7(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A Notebook 7 server on a copy of the notebook; yields (notebook url with token, log)."""
    if importlib.util.find_spec("notebook") is None:  # the `test` extra installs it
        if os.environ.get("CI"):
            pytest.fail("Notebook 7 test cannot run in CI: notebook is not installed")
        pytest.skip("notebook is not installed")
    with jupyter_server(tmp_path, "notebook") as (base, token, log):
        yield f"{base}/notebooks/{NOTEBOOK}?token={token}", log


@pytest.mark.timeout(420)
def test_quickstart_dashboard_is_live_in_notebook7(notebook7: tuple[str, Path]) -> None:
    sync_api = start_browser_test(
        "notebook7.png", "notebook7-failure.png", "notebook7-console.log", "notebook7-jupyter.log"
    )
    url, log = notebook7
    console_errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser, page = open_page(p, console_errors)
        try:
            goto_notebook(page, url)
            page.wait_for_selector(IDLE, timeout=120_000)
            run_all(page)
            wait_for_live_step(page)
            page.wait_for_function(
                "() => !!document.querySelector('.nbm-root [data-chart=loss] canvas')",
                timeout=120_000,
            )
            step1, png1 = _step(page), chart_png(page)
            step2, png2 = wait_for_progress(page, step1, png1)
            status = page.locator(".nbm-root [data-field=status]").first.inner_text()
            reads = f"step {step1} -> {step2}"
            assert status in ("running", "degraded"), status
            assert step2 < STEPS, f"the training cell finished before the second read: {reads}"
            assert 0 < step1 < step2, reads
            assert png1 != png2, f"the loss chart did not change between two reads ({reads})"

            interrupt_and_close(page)
            assert_rendered_cleanly(page, console_errors)
            assert _step(page) >= step2
            assert chart_ink(page) > 0, "the loss chart was not drawn"

            output = page.locator(".jp-OutputArea-output:has(.nbm-root)").first
            output.scroll_into_view_if_needed()
            output.screenshot(path=str(ARTIFACTS / "notebook7.png"))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "notebook7-failure.png"), full_page=True)
            if not (ARTIFACTS / "notebook7.png").exists():
                page.screenshot(path=str(ARTIFACTS / "notebook7.png"))
            (ARTIFACTS / "notebook7-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "notebook7-jupyter.log")
            raise
        finally:
            browser.close()
