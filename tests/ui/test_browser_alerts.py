"""The alert strip in a real (headless) Chromium, in a bare page (tests/ui/harness.py): a cause
alert opens on a click and shows its cause, where, evidence, the symptom it took in and its
fix; the symptom it took in is not listed on its own."""

from __future__ import annotations

import dataclasses

import pytest
from tests.ui.harness import serve_page, widget_payload
from tests.ui.test_browser import BROWSER_ARGS, CHROMIUM, _require_browser
from tests.ui.test_dashboard import make_frame

from nbmonitor.health import Alert
from nbmonitor.health.diagnose import cause_alert
from nbmonitor.ui.dashboard import Dashboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_an_opened_alert_shows_its_cause_evidence_and_fix() -> None:
    sync_api = _require_browser()
    symptom = Alert("exploding_gradients", "warning", "Gradients explode at step 40", 40, 1.0)
    cause = cause_alert(
        "zero_grad_missing",
        cause="`optimizer.zero_grad()` is never called: gradients add up across steps",
        said="grad norm 0.4 → 40 over 120 steps",
        evidence={"grad_norm": [0.4, 40.0], "steps": [1, 120]},
        fix="call `optimizer.zero_grad()` once per step",
        place="param group 0",
        step=120,
        time=2.0,
    )
    cause = dataclasses.replace(cause, explains=(("exploding_gradients", 40),))
    dash = Dashboard("alerts-run", "cpu", 200)
    dash.publish(make_frame(130, alerts=(symptom, cause)))
    payload = widget_payload(dash.widget)
    console: list[str] = []
    with serve_page() as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1020, "height": 700})
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(url)
            page.wait_for_function("() => window.nbmReady === true")
            page.evaluate("(p) => window.nbmMount(p)", payload)
            items = page.locator(".nbm-alerts > .nbm-alert")
            items.first.wait_for()
            assert items.count() == 1  # the symptom is under its cause
            detail = page.locator(".nbm-alert-detail")
            assert not detail.is_visible()
            page.locator(".nbm-alert-summary").click()
            detail.wait_for(state="visible")
            text = detail.inner_text()
            for said in (
                "optimizer.zero_grad() is never called",
                "param group 0",
                "grad norm",
                "0.4, 40",
                "exploding_gradients (step 40)",
                "call optimizer.zero_grad() once per step",
            ):
                assert said.replace("`", "") in text.replace("`", ""), (said, text)
            page.locator(".nbm-alert-summary").click()
            detail.wait_for(state="hidden")
        finally:
            browser.close()
    assert console == []
