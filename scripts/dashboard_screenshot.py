"""Regenerate docs/dashboard.png, the README's picture: the quickstart notebook run to the end
in a real JupyterLab and headless Debian Chromium (the browser test's helpers), then the
dashboard's output area. A healthy run: the picture must show no alert.

    python3 scripts/dashboard_screenshot.py [--steps 2500] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ui import test_browser as ui  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2500)  # the quickstart's default
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    ui.STEPS = args.steps
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # steady steps on a shared machine
    from playwright import sync_api  # the browser test's dependency (the test extra)

    with (
        tempfile.TemporaryDirectory() as tmp,
        ui.jupyter_server(Path(tmp), "lab", steps=args.steps) as (base, token, _log),
        sync_api.sync_playwright() as p,
    ):
        errors: list[str] = []
        browser, page = ui.open_page(p, errors, viewport=(1280, 1600))
        try:
            ui.goto_notebook(page, f"{base}/lab/tree/{ui.NOTEBOOK}?token={token}")
            select = page.locator(".jp-Dialog button.jp-mod-accept", has_text="Select")
            with contextlib.suppress(sync_api.TimeoutError):
                select.click(timeout=5_000)
            page.wait_for_selector(ui.IDLE, timeout=120_000)
            ui.run_all(page)
            ui.wait_for_live_step(page)
            page.wait_for_function(  # the whole run: the last cell closes the monitor
                "() => document.querySelector('.nbm-root [data-field=status]')?.textContent"
                " === 'closed'",
                timeout=3_600_000,
            )
            page.wait_for_selector(ui.IDLE, timeout=120_000)
            page.wait_for_timeout(2_000)  # the last frame's curves
            ui.assert_rendered_cleanly(page, errors)
            output = page.locator(".jp-OutputArea-output:has(.nbm-root)").first
            output.scroll_into_view_if_needed()
            alerts = output.locator(".nbm-alert").count()
            output.screenshot(path=str(args.out))
            print(f"wrote {args.out} ({alerts} alerts shown)")
            return 1 if alerts else 0
        finally:
            browser.close()


if __name__ == "__main__":
    sys.exit(main())
