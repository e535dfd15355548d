"""notebooks/02-gradient-debugging.ipynb, 04-frameworks.ipynb and 08-export.ipynb in a real
JupyterLab and Debian's chromium: every cell runs (Run All), each shows what it should, and the
browser logs no errors or warnings. Each waits for the cells to have run, whatever the
machine's speed (a bounded wait for a condition, never a pause)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

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

# Every code cell has run: its prompt holds an execution count, none is queued or running.
_ALL_RAN_JS = """() => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')];
  return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
}"""


def run_notebook(page: Any, sync_api: Any, url: str, bound_ms: int) -> str:
    """Open the notebook, run all its cells and wait for every one to have run; the text of
    all outputs."""
    open_and_run_all(page, url)
    page.wait_for_function(_ALL_RAN_JS, timeout=bound_ms)
    page.wait_for_selector(IDLE, timeout=120_000)
    text = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert "Traceback" not in text and "Error displaying widget" not in text, text[-3000:]
    return text


@pytest.mark.timeout(420)
def test_gradient_debugging_notebook(tmp_path: Path) -> None:
    notebook = "02-gradient-debugging.ipynb"
    sync_api = start_browser_test("debugging.png", "debugging-failure.png", "debugging.log")
    console: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", notebook) as (base, token, _log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console, viewport=(1400, 1400))
        try:
            url = f"{base}/lab/tree/{notebook}?token={token}"
            text = run_notebook(page, sync_api, url, 300_000)
            # Each section's bug is named in its cell's output.
            for expected in (
                "[gradient_not_flowing]",
                "[params_not_in_optimizer]",
                "stopped: nbmonitor: non-finite gradient",
                "[vanishing_gradients]",
                "[dead_units]",
            ):
                assert expected in text, expected
            # The last cell's summary of a LoRA model renders.
            assert "trainable" in page.locator(".jp-OutputArea-output").last.inner_text()
            assert_console_clean(console)
            page.screenshot(path=str(ARTIFACTS / "debugging.png"), full_page=True)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "debugging-failure.png"), full_page=True)
            (ARTIFACTS / "debugging.log").write_text("\n".join(console))
            raise
        finally:
            browser.close()


@pytest.mark.timeout(600)
def test_frameworks_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    notebook = "04-frameworks.ipynb"
    sync_api = start_browser_test("frameworks.png", "frameworks-failure.png", "frameworks.log")
    monkeypatch.setenv("NBMONITOR_FRAMEWORKS_STEPS", "20")
    console: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", notebook) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console, viewport=(1400, 1600))
        try:
            url = f"{base}/lab/tree/{notebook}?token={token}"
            text = run_notebook(page, sync_api, url, 480_000)
            # The Trainer's own progress table and nbmonitor's dashboard, closed with the run.
            assert page.locator(".jp-OutputArea-output progress").count() >= 1
            page.wait_for_function(
                "() => document.querySelector('.nbm-root [data-field=status]')"
                "?.textContent === 'closed'",
                timeout=120_000,
            )
            step = page.locator(".nbm-root [data-field=step]").first.inner_text()
            assert step.split("/")[0].strip() == "20", step
            page.wait_for_function(
                "() => [...document.querySelectorAll("
                "'.nbm-root .nbm-panel[data-panel=training] .nbm-chart:not([hidden]) canvas')]"
                f".filter(c => ({_INK_JS})(c) > 0).length >= 4",
                timeout=60_000,
            )
            assert "nbmonitor: 20 steps; Trainer: global_step 20" in text
            assert_console_clean(console)
            page.locator(".jp-OutputArea-output:has(.nbm-root)").first.screenshot(
                path=str(ARTIFACTS / "frameworks.png")
            )
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "frameworks-failure.png"), full_page=True)
            (ARTIFACTS / "frameworks.log").write_text("\n".join(console))
            shutil.copy(log, ARTIFACTS / "frameworks-jupyter.log")
            raise
        finally:
            browser.close()


@pytest.mark.timeout(420)
def test_export_notebook(tmp_path: Path) -> None:
    for tool in ("tensorboard", "pyarrow", "prometheus_client", "wandb"):
        pytest.importorskip(tool)
    notebook = "08-export.ipynb"
    sync_api = start_browser_test("export-failure.png", "export.log")
    console: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", notebook, steps=300) as (base, token, _log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console, viewport=(1400, 1400))
        try:
            url = f"{base}/lab/tree/{notebook}?token={token}"
            text = run_notebook(page, sync_api, url, 300_000)
            # The live Prometheus endpoint, the run's files, and the exports from disk.
            assert "nbmonitor_steps_total{" in text
            assert "history.parquet" in text and "exported-tb" in text
            assert "-> parquet: exported-parquet" in text
            # The DataFrame renders as the notebook's HTML table.
            assert page.locator(".jp-OutputArea-output table").count() >= 1
            assert_console_clean(console)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "export-failure.png"), full_page=True)
            (ARTIFACTS / "export.log").write_text("\n".join(console))
            raise
        finally:
            browser.close()
