"""An out-of-memory error in a notebook cell, in a real JupyterLab and a headless Chromium: the
card shows under the failing cell with what was allocated, where, what held memory and what to
change; its button gives back what the stored traceback held; the next cell runs. The Memory
tab of the same run's dashboard shows the breakdown table.

The error is the CPU allocator's own refusal (``DefaultCPUAllocator: can't allocate memory``,
raised by a module's forward asking for 2**62 bytes), the error nbmonitor handles for a CPU
OOM (docs/memory.md): no memory limit, no real exhaustion of the shared machine. Every wait is
for a condition on the page, with a generous bound.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tests.ui.test_browser import (
    ARTIFACTS,
    IDLE,
    assert_console_clean,
    jupyter_server,
    open_and_run_all,
    open_page,
    start_browser_test,
)

nbformat = pytest.importorskip("nbformat")

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETUP = """
import torch, nbmonitor
torch.manual_seed(0)

class Blowup(torch.nn.Module):
    armed = False

    def forward(self, x):
        if self.armed:
            features = torch.ones(64 * 2**20)  # 256 MiB held by this frame
            torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator refuses this one
        return x

model = torch.nn.Sequential(
    torch.nn.Linear(16, 64), torch.nn.ReLU(), Blowup(), torch.nn.Linear(64, 1)
)
opt = torch.optim.Adam(model.parameters())
mon = nbmonitor.attach(model, opt, interval=0.1)
for _ in range(3):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()  # no zero_grad: the gradients are still allocated in the next forward
mon.flush()
"""
FAIL = """
model[2].armed = True
model(torch.randn(8, 16)).pow(2).mean().backward()
"""
AFTER = "model[2].armed = False\nprint('after:', model(torch.randn(2, 16)).shape)\nmon.close()"

CARD = ".jp-OutputArea-output .nbmonitor-oom"
BUTTON = ".jp-OutputArea-output button:has-text('Free what this error holds')"
FREED = re.compile(r"free_oom: ([\d.]+) (MiB|GiB) of resident memory \(RSS\) came back")


def notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP, FAIL, AFTER)]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


@pytest.mark.timeout(420)
def test_an_oom_card_in_jupyterlab_with_advice_and_a_button_that_frees(tmp_path: Path) -> None:
    sync_api = start_browser_test("oom-card.png", "oom-failure.png", "oom-console.log")
    console_errors: list[str] = []
    source = notebook(tmp_path / "oom.ipynb")
    with (
        jupyter_server(tmp_path, "lab", source) as (base, token, log),
        sync_api.sync_playwright() as p,
    ):
        browser, page = open_page(p, console_errors)
        try:
            # Run All stops at the failing cell: JupyterLab runs no cell after an error.
            open_and_run_all(page, f"{base}/lab/tree/{source.name}?token={token}")
            page.wait_for_selector(CARD, timeout=180_000)
            page.wait_for_selector(IDLE, timeout=120_000)
            cells = page.locator(".jp-Notebook .jp-CodeCell")
            failing = cells.nth(1)
            # The card is under the failing cell, after its traceback, and only there.
            assert (
                failing.locator(
                    ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"
                ).count()
                >= 1
            )
            assert page.locator(CARD).count() == 1
            assert failing.locator(".nbmonitor-oom").count() == 1
            card = failing.locator(".nbmonitor-oom").inner_text()
            assert "CPU out of memory" in card
            assert "in the forward of module 2 at step 4" in card, card
            assert "DefaultCPUAllocator" in card
            assert "What held memory" in card and "optimizer_state" in card
            assert "local `features` in Blowup.forward (2)" in card  # the 256 MiB, by its frame
            assert "256 MiB" in card
            assert "local `input` in Sequential.forward" in card and "((root))" not in card
            # Advice: gradients left allocated during the forward, and the way out.
            assert "optimizer.zero_grad(set_to_none=True)" in card
            assert "mon.free_oom()" in card
            failing.scroll_into_view_if_needed()
            failing.screenshot(path=str(ARTIFACTS / "oom-card.png"))

            # The button gives back what the stored traceback held.
            page.locator(BUTTON).click()
            page.wait_for_function(
                "() => /came back/.test(document.body.innerText)", timeout=120_000
            )
            freed = FREED.search(failing.inner_text())
            assert freed is not None, failing.inner_text()
            mib = float(freed.group(1)) * (1024 if freed.group(2) == "GiB" else 1)
            assert mib >= 200, freed.group(0)  # the 256 MiB `features` held
            assert "sys.last_traceback" in failing.inner_text()

            # The next cell runs without a restart.
            cells.nth(2).locator(".jp-InputPrompt").click()
            page.keyboard.press("Shift+Enter")
            page.wait_for_function(
                "() => document.body.innerText.includes('after: torch.Size([2, 1])')",
                timeout=120_000,
            )
            page.wait_for_selector(IDLE, timeout=120_000)

            # The run's Memory tab: the breakdown table, one row for the CPU.
            page.locator(".nbm-root .nbm-tab[data-tab=memory]").first.click()
            page.wait_for_function(
                """() => [...document.querySelectorAll(
                      '.nbm-root .nbm-memory-table tbody tr td:first-child')]
                    .some(td => td.textContent === 'cpu')""",
                timeout=120_000,
            )
            title = page.locator(".nbm-root .nbm-memory-title").first.inner_text()
            assert title.startswith("What holds memory (step"), title
            body = page.evaluate("() => document.body.textContent")
            assert "Error displaying widget" not in body
            assert_console_clean(console_errors)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "oom-failure.png"), full_page=True)
            (ARTIFACTS / "oom-console.log").write_text("\n".join(console_errors))
            shutil.copy(log, ARTIFACTS / "oom-jupyter.log")
            raise
        finally:
            browser.close()
