"""The quickstart notebook in a real JupyterLab and a real (headless) Chromium.

Starts JupyterLab on 127.0.0.1 with a random port and token and private Jupyter dirs, runs every
cell of a copy of notebooks/01-quickstart.ipynb, and checks what a user sees: the dashboard
renders, its step counter grows and its loss chart (a canvas) changes while the training cell
runs, and the browser logs no errors or warnings. A screenshot is always written to
test-artifacts/ (it is the README picture, docs/dashboard.png), and a full-page one on failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.required import missing_tool

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path(os.environ.get("NBMONITOR_CHROMIUM", "/usr/bin/chromium"))
NOTEBOOK = "01-quickstart.ipynb"
STEPS = 6000  # long enough to read the live dashboard twice while the loop runs
# How long the dashboard may take to show progress: a slow first step on a loaded machine
# included. A bound on waiting for progress, never a pause (docs/testing.md).
PROGRESS_WAIT_S = 120.0
# Set (CI's wheel stage): JupyterLab's kernels import the installed nbmonitor, not this checkout.
INSTALLED = bool(os.environ.get("NBMONITOR_TEST_INSTALLED"))


def _require_browser() -> Any:
    """Playwright's sync API; skip by hand without Chromium, fail under scripts/test or CI."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} not found"
    try:
        from playwright import sync_api
    except ImportError:
        missing = "playwright is not installed"
    if missing:
        missing_tool(f"browser test cannot run: {missing}")
    return sync_api


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def jupyter_server(
    tmp_path: Path, app: str = "lab", notebook: str | Path = NOTEBOOK, steps: int = STEPS
) -> Iterator[tuple[str, str, Path]]:
    """`jupyter {app}` ("lab" or "notebook") on a copy of the notebook, with a random port and
    token and private Jupyter dirs; yields (base url, token, log path)."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    # A name is one of notebooks/; a Path a notebook the test wrote.
    source = notebook if isinstance(notebook, Path) else ROOT / "notebooks" / notebook
    shutil.copy(source, notebooks / source.name)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for var, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
        ("JUPYTER_DATA_DIR", "data"),  # kernelspecs and extensions still come from sys.prefix
        ("IPYTHONDIR", "ipython"),
    ):
        env[var] = str(tmp_path / sub)
    # Start the notebook's kernel without the "Select Kernel" dialog, and no news prompt.
    settings = tmp_path / "lab-settings" / "@jupyterlab"
    for plugin, value in (
        ("notebook-extension/tracker", '{"autoStartDefaultKernel": true}'),
        ("apputils-extension/notification", '{"fetchNews": "false"}'),
    ):
        target = settings / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(value)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    if not INSTALLED:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    check_package(env, notebooks)
    env["NBMONITOR_QUICKSTART_STEPS"] = str(steps)
    # No network here: no news feed, no update check (Notebook 7 has neither).
    no_network = {
        "lab": [
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        "notebook": [],
    }[app]
    log = tmp_path / "jupyter.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter", app, "--no-browser",
                f"--IdentityProvider.token={token}", "--ServerApp.ip=127.0.0.1", f"--port={port}",
                "--ServerApp.port_retries=0", f"--notebook-dir={notebooks}",
                *no_network,
                *(["--allow-root"] if os.geteuid() == 0 else []),  # CI containers run as root
            ],
            env=env, cwd=notebooks, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the finally below ends all of it
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"jupyter {app} did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, token, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server on a copy of the notebook; yields (notebook url with token, log)."""
    with jupyter_server(tmp_path, "lab") as (base, token, log):
        yield f"{base}/lab/tree/{NOTEBOOK}?token={token}", log


# Whether a chart's canvas is painted (uPlot draws into one 2D canvas per chart): 1 when it
# differs from a blank canvas of its size, else 0. toDataURL rather than getImageData, whose
# repeated readbacks make Chromium log a performance warning.
_INK_JS = """(c) => {
  const blank = document.createElement('canvas');
  blank.width = c.width;
  blank.height = c.height;
  return c.width > 0 && c.height > 0 && c.toDataURL() !== blank.toDataURL() ? 1 : 0;
}"""
LOSS_CANVAS = ".nbm-root [data-chart=loss] canvas"


def chart_ink(page: Any, selector: str = LOSS_CANVAS) -> int:
    """1 when the first canvas matching ``selector`` is painted, else 0 (also without one)."""
    canvas = page.locator(selector).first
    if not canvas.count():
        return 0
    return int(canvas.evaluate(_INK_JS))


def chart_png(page: Any, selector: str = ".nbm-root [data-chart=loss]") -> bytes:
    """A screenshot of one chart: two of them differ when the chart was redrawn."""
    return bytes(page.locator(selector).first.screenshot())


def _step(page: Any) -> int:
    text = page.locator(".nbm-root [data-field=step]").first.inner_text()
    digits = text.split("/")[0].replace(",", "").strip()
    return int(digits) if digits.isdigit() else -1


IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"


def open_page(
    playwright: Any, console_errors: list[str], viewport: tuple[int, int] = (1400, 2600)
) -> tuple[Any, Any]:
    """Debian's headless chromium with one page whose console errors and warnings are kept."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
    page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    page.on(
        "console",
        lambda msg: (
            console_errors.append(f"{msg.type}: {msg.text}")
            if msg.type in ("error", "warning")
            else None
        ),
    )
    page.on("pageerror", lambda exc: console_errors.append(f"pageerror: {exc}"))
    page.set_default_timeout(60_000)
    return browser, page


def goto_notebook(page: Any, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)


def open_and_run_all(page: Any, url: str) -> None:
    """Open the notebook at ``url``, accept the kernel dialog if one shows, wait for the
    kernel, and Run All Cells."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    goto_notebook(page, url)
    select = page.locator(".jp-Dialog button.jp-mod-accept", has_text="Select")
    with contextlib.suppress(PlaywrightTimeout):
        select.click(timeout=5_000)
    page.wait_for_selector(IDLE, timeout=120_000)
    run_all(page)


def menu(page: Any, top: str, item: str) -> None:
    """Click a Lumino menu entry (the same in JupyterLab 4 and Notebook 7)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{top}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(rf"^{item}$")).click()


_STARTED_JS = """() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
  .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""


def run_all(page: Any, attempts: int = 3) -> None:
    """Run All Cells, and make sure a cell started: a front end still initialising (Notebook 7
    once raised "reading 'schema'" there) can drop the command; then reload and try again."""
    for attempt in range(attempts):
        menu(page, "Run", "Run All Cells")
        try:
            page.wait_for_function(_STARTED_JS, timeout=20_000)
            return
        except Exception:
            if attempt == attempts - 1:
                raise
            page.reload(wait_until="domcontentloaded")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_selector(IDLE, timeout=120_000)


def wait_for_live_step(page: Any) -> None:
    """The dashboard is on the page and its step counter has left 0."""
    page.wait_for_selector(".nbm-root", timeout=120_000)
    page.wait_for_function(
        """() => {
          const s = document.querySelector('.nbm-root [data-field=step]');
          return s && parseInt(s.textContent.replace(/,/g, '')) > 0;
        }""",
        timeout=120_000,
    )


def wait_for_progress(page: Any, step: int, png: bytes | None = None) -> tuple[int, bytes]:
    """Wait until the dashboard's step counter has passed ``step`` (and, given ``png``, the
    loss chart no longer looks like it): progress, however slow the machine, rather than a
    fixed pause whose outcome depends on its speed. The step and chart seen then."""
    deadline = time.monotonic() + PROGRESS_WAIT_S
    while True:
        now = _step(page)
        shot = chart_png(page) if png is not None and now > step else b""
        if now > step and (png is None or shot != png):
            return now, shot
        assert time.monotonic() < deadline, f"no progress past step {step}: {now}"
        page.wait_for_timeout(100)


def interrupt_and_close(page: Any) -> None:
    """Stop the training loop rather than wait for it, then make sure the monitor is closed.

    Interrupting aborts the rest of "Run All", so the last cell (mon.close()) is run by hand
    unless the loop had already finished and it ran by itself.
    """
    menu(page, "Kernel", "Interrupt Kernel")
    page.wait_for_selector(IDLE, timeout=120_000)
    status = page.locator(".nbm-root [data-field=status]").first.inner_text()
    if status != "closed":
        page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").last.click()
        page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        "() => document.querySelector('.nbm-root [data-field=status]')?.textContent === 'closed'",
        timeout=120_000,
    )
    page.wait_for_timeout(1_500)  # let the last frame's curves draw


# The hosts' own console noise, matched whole, that no notebook cell causes: Notebook 7 logs
# these on every page load (its menus, its collaborative document model, and the "schema" race
# that run_all() works around), marimo its unused preloaded background images. Anything else,
# an error or a warning, fails the test.
HOST_NOISE = re.compile(
    r"warning: \[yjs#509\] Not same Y\.Doc"
    r"|warning: Menu entry for command '[\w:-]+' is duplicated\."
    r"|pageerror: Cannot read properties of undefined \(reading 'schema'\)"
    r"|warning: The resource http://127\.0\.0\.1:\d+/assets/[\w-]+\.png was preloaded using"
    r" link preload but not used within a few seconds from the window's load event\. Please"
    r" make sure it has an appropriate `as` value and it is preloaded intentionally\."
)


def assert_console_clean(console_errors: list[str]) -> None:
    """No error and no warning in the browser's console but the hosts' known noise."""
    left = [e for e in console_errors if not HOST_NOISE.fullmatch(e)]
    assert not left, left


def assert_rendered_cleanly(page: Any, console_errors: list[str]) -> None:
    body = page.locator("body").inner_text()
    assert "Error displaying widget" not in body
    assert "Loading widget" not in body
    assert page.locator(".jp-OutputArea .bqplot.figure").count() == 0  # our own charts only
    # The training tab's charts are drawn: loss, learning rate, gradient norm, step time, ...
    painted = page.evaluate(
        f"""() => [...document.querySelectorAll(
              '.nbm-root .nbm-panel[data-panel=training] .nbm-chart:not([hidden]) canvas')]
            .map({_INK_JS})"""
    )
    assert len(painted) >= 4 and all(n > 0 for n in painted), painted
    assert_console_clean(console_errors)


def check_package(env: dict[str, str], cwd: Path) -> None:
    """The nbmonitor that a kernel started in `cwd` with `env` imports is this checkout (or,
    with NBMONITOR_TEST_INSTALLED, an installed one) and carries the built front end."""
    where = subprocess.run(
        [sys.executable, "-c", "import nbmonitor; print(nbmonitor.__file__)"],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(ROOT) != INSTALLED, f"the kernel would import {package}"
    assert (package / "static" / "widget.js").is_file(), (
        f"front end not built in {package}: run `npm run build` in js/ (pip install -e . does it)"
    )


def start_browser_test(*artifacts: str) -> Any:
    """Playwright's sync API, once the artifacts an earlier run left behind are gone (the
    server fixture has checked that the front end is built)."""
    sync_api = _require_browser()
    ARTIFACTS.mkdir(exist_ok=True)
    for stale in artifacts:
        (ARTIFACTS / stale).unlink(missing_ok=True)
    return sync_api


@pytest.mark.timeout(420)
def test_quickstart_dashboard_is_live(lab: tuple[str, Path]) -> None:
    sync_api = start_browser_test("browser-failure.png", "browser-console.log", "jupyter.log")
    url, log = lab
    console_errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser, page = open_page(p, console_errors)
        try:
            # Should the kernel dialog show anyway (settings not picked up), accept the default.
            open_and_run_all(page, url)
            wait_for_live_step(page)
            # The loss chart has drawn (the first frames may precede any step).
            page.wait_for_function(
                f"() => {{ const c = document.querySelector('{LOSS_CANVAS}');"
                f" return c && ({_INK_JS})(c) > 0; }}",
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

            # Don't wait for the whole run: a loaded CI box can be slow.
            interrupt_and_close(page)
            assert_rendered_cleanly(page, console_errors)
            assert _step(page) >= step2
            # The layout fits a laptop screen: header, gauges, tabs and the training charts
            # within 800 px.
            box = page.locator(".nbm-root").first.bounding_box()
            assert box is not None and box["height"] < 800, box
            # The per-layer panel: a drawn heatmap and one table row per parameter (4 Linear).
            page.locator(".nbm-root .nbm-tab[data-tab=layers]").first.click()
            canvas = page.locator(".nbm-root .nbm-heatmap-canvas").first
            assert canvas.evaluate("c => c.width * c.height") > 0
            assert (
                page.locator(".nbm-root .nbm-panel[data-panel=layers] .nbm-table tbody tr").count()
                == 8
            )

            page.locator(".nbm-root .nbm-tab[data-tab=training]").first.click()
            page.wait_for_timeout(500)
            output = page.locator(".jp-OutputArea-output:has(.nbm-root)").first
            output.scroll_into_view_if_needed()
            output.screenshot(path=str(ARTIFACTS / "dashboard.png"))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "browser-failure.png"), full_page=True)
            (ARTIFACTS / "browser-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "jupyter.log")
            raise
        finally:
            browser.close()


RUNS_NOTEBOOK = "03-runs.ipynb"


@pytest.mark.timeout(420)
def test_runs_notebook_tails_replays_and_compares(tmp_path: Path) -> None:
    """notebooks/03-runs.ipynb: the tail dashboard updates while another process trains, then
    the replayed dashboard and the comparison figure render."""
    sync_api = start_browser_test(
        "runs.png", "runs-end.png", "runs-failure.png", "runs-console.log", "runs-jupyter.log"
    )
    console_errors: list[str] = []
    # The notebook's own length (two runs of 3,000 steps, one after the other), not the
    # quickstart test's 6,000: nothing here needs the run to outlast a read.
    with (
        jupyter_server(tmp_path, "lab", RUNS_NOTEBOOK, steps=3000) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console_errors)
        try:
            open_and_run_all(page, f"{base}/lab/tree/{RUNS_NOTEBOOK}?token={token}")
            wait_for_live_step(page)  # the tail dashboard shows the other process's steps
            # It moves on while the other process trains, unless that run had already ended
            # (a fast machine): then it shows the whole run, closed.
            first = _step(page)
            if page.locator(".nbm-root [data-field=status]").first.inner_text() != "closed":
                page.wait_for_function(
                    f"""() => {{
                      const s = document.querySelector('.nbm-root [data-field=step]');
                      const done = document.querySelector('.nbm-root [data-field=status]');
                      return parseInt(s.textContent.replace(/,/g, '')) > {first}
                        || done.textContent === 'closed';
                    }}""",
                    timeout=PROGRESS_WAIT_S * 1000,
                )
            # Every cell ran: the tail closed with the run, the replay and the figure are drawn.
            page.wait_for_function(
                "() => [...document.querySelectorAll('.bqplot.figure .mainheading')]"
                ".some(h => h.textContent.trim() === 'loss by run')",
                timeout=300_000,
            )
            # Both dashboards (the tail and the replay) drew their loss chart.
            inks = [int(c.evaluate(_INK_JS)) for c in page.locator(LOSS_CANVAS).all()]
            assert len(inks) == 2 and all(inks), inks
            page.wait_for_selector(IDLE, timeout=120_000)
            statuses = page.locator(".nbm-root [data-field=status]").all_inner_texts()
            assert len(statuses) == 2 and set(statuses) == {"closed"}, statuses
            assert page.locator(".jp-OutputArea-output table").count() >= 1  # list_runs
            body = page.locator("body").inner_text()
            assert "Error displaying widget" not in body and "Traceback" not in body
            assert_console_clean(console_errors)
            page.screenshot(path=str(ARTIFACTS / "runs.png"), full_page=True)
            last = page.locator(".jp-OutputArea-output").last
            last.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "runs-end.png"))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "runs-failure.png"), full_page=True)
            (ARTIFACTS / "runs-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "runs-jupyter.log")
            raise
        finally:
            browser.close()


RANKS_NOTEBOOK = "06-ranks.ipynb"


@pytest.mark.timeout(420)
def test_ranks_notebook_tails_a_two_rank_job(tmp_path: Path) -> None:
    """notebooks/06-ranks.ipynb: the ranks panel follows a two-rank torchrun job while it runs
    (its heatmap and tables grow), then the finished job names rank 1 as the straggler."""
    sync_api = start_browser_test("ranks.png", "ranks-failure.png", "ranks-console.log")
    console_errors: list[str] = []
    with (
        jupyter_server(tmp_path, "lab", RANKS_NOTEBOOK) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console_errors)
        try:
            open_and_run_all(page, f"{base}/lab/tree/{RANKS_NOTEBOOK}?token={token}")
            # The tail's panel shows both ranks' steps while the job runs.
            wait_for_live_step(page)
            page.wait_for_function(
                "() => document.querySelectorAll("
                "'table.nbm-ranks-table[data-field=ranks] tbody tr').length >= 2",
                timeout=120_000,
            )
            first = _step(page)
            # Every cell ran: the tail closed with the job, then the job's own panel.
            page.wait_for_function(
                "() => document.querySelectorAll('.nbm-root').length >= 2", timeout=300_000
            )
            page.wait_for_selector(IDLE, timeout=120_000)
            statuses = page.locator(".nbm-root [data-field=status]").all_inner_texts()
            assert set(statuses) == {"closed"}, statuses
            assert _step(page) > first
            canvas = page.locator(".nbm-root .nbm-heatmap-canvas").last
            assert canvas.evaluate("c => c.width * c.height") > 0
            titles = page.locator(".nbm-root .nbm-ranks .nbm-section-title").all_text_contents()
            assert any(t.startswith("step_time per rank") for t in titles), titles
            rows = page.locator("table.nbm-ranks-table[data-field=ranks]").last
            assert rows.locator("tbody tr").count() == 2
            alerts = page.locator(".nbm-root .nbm-alerts").last.inner_text()
            assert "Rank 1 on" in alerts and "straggler" in alerts, alerts
            body = page.locator("body").inner_text()
            assert "Error displaying widget" not in body and "Traceback" not in body
            assert_console_clean(console_errors)
            last = page.locator(".jp-OutputArea-output:has(.nbm-root)").last
            last.scroll_into_view_if_needed()
            page.wait_for_timeout(500)
            last.screenshot(path=str(ARTIFACTS / "ranks.png"))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "ranks-failure.png"), full_page=True)
            (ARTIFACTS / "ranks-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "ranks-jupyter.log")
            raise
        finally:
            browser.close()
