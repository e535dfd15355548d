"""notebooks/05-where-the-time-goes.ipynb in a real JupyterLab and a headless Chromium: the
timeline panel (stacked phases, gantt, summary table) and the step-time charts render, and the
slow loader is named input-bound."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.ui.test_browser import (
    _INK_JS,
    ARTIFACTS,
    IDLE,
    assert_console_clean,
    jupyter_server,
    open_and_run_all,
    open_page,
    start_browser_test,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "05-where-the-time-goes.ipynb"

_HEADINGS_JS = """() => [...document.querySelectorAll('.nbm-root .nbm-chart-title')]
  .map(h => h.textContent.trim())"""


@pytest.mark.timeout(420)
def test_timeline_notebook_renders_the_timeline(tmp_path: Path) -> None:
    sync_api = start_browser_test("timeline.png", "timeline-failure.png", "timeline-console.log")
    console_errors: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", NOTEBOOK, steps=300) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console_errors)
        try:
            open_and_run_all(page, f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            # The last cell prints the profiler's trace path: every cell before it has run.
            page.wait_for_function(
                "() => document.body.innerText.includes('.pt.trace.json')", timeout=300_000
            )
            page.wait_for_selector(IDLE, timeout=120_000)
            page.wait_for_timeout(1_500)  # the closed dashboards' last frames draw
            headings = page.evaluate(_HEADINGS_JS)
            for title in (
                "Step phases (per step)",
                "Last steps: phases and spans",
                "Step time",
                "Samples/s",
            ):
                # one per dashboard: slow data, data ready, throughput
                assert headings.count(title) == 3, (title, headings)
            # The stacked phases and the gantt are drawn in their canvases.
            drawn = page.evaluate(
                f"""() => [...document.querySelectorAll(
                      '.nbm-root [data-chart=phases] canvas, .nbm-root [data-chart=gantt] canvas')]
                    .map({_INK_JS})"""
            )
            assert len(drawn) == 6 and all(n > 0 for n in drawn), drawn
            tables = page.locator("table.nbm-timeline-summary")
            assert tables.count() == 3
            # text_content: JupyterLab may have stopped rendering a cell scrolled out of view.
            first = tables.first.text_content() or ""
            assert "% of run" in first and "data (span)" in first
            body = page.evaluate("() => document.body.textContent")  # off-screen cells too
            assert "[input_bound] Input-bound:" in body
            assert "Error displaying widget" not in body and "Traceback" not in body
            assert_console_clean(console_errors)
            timeline = page.locator(".jp-OutputArea-output:has(table.nbm-timeline-summary)")
            timeline.first.scroll_into_view_if_needed()
            timeline.first.screenshot(path=str(ARTIFACTS / "timeline.png"))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "timeline-failure.png"), full_page=True)
            (ARTIFACTS / "timeline-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "timeline-jupyter.log")
            raise
        finally:
            browser.close()
