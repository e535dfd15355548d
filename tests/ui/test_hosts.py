"""The dashboard in the hosts that are not JupyterLab, as close as this machine gets to them
(tests/ui/hosts.py says what is real and what is a stand-in; docs/testing.md, "Hosts"):

- VS Code: its notebook webview renders widgets with an ipywidgets widget manager and loads
  anywidget's front end by requirejs from the kernel environment's nbextensions folder. Here:
  the standalone ipywidgets manager (html-manager) with that same anywidget module, no network
  (every request outside 127.0.0.1 is refused and counted), the dashboard's state as ipywidgets
  embeds it and its later updates as the comm messages the kernel sent.
- Colab: its output frame shows no widget update sent from a background thread. Here: a kernel
  whose comm drops every message sent off the main thread (hosts.MainThreadOnly) runs a long
  training cell on the route chosen for Colab; the browser then renders the dashboard from
  what got through.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.ui.hosts import CommRecorder, embed_state, serve_manager_page
from tests.ui.test_browser import _INK_JS, ARTIFACTS, chart_png, open_page, start_browser_test
from tests.ui.test_dashboard import make_frame
from tests.ui.test_delivery import run_cells

from nbmonitor._engine.frame import Series
from nbmonitor.ui.dashboard import Dashboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]

# html-manager's own JSON-schema validator (ajv in strict mode) warns about ipywidgets' state
# schema when the manager validates a state; no widget causes it.
MANAGER_NOISE = re.compile(
    r'warning: strict mode: use allowUnionTypes to allow union type keyword at "#/properties/'
    r'state/additionalProperties/properties/buffers/items/properties/path/items" \(strictTypes\)'
)
TRAINING_CANVASES = ".nbm-root .nbm-panel[data-panel=training] .nbm-chart:not([hidden]) canvas"


def frame(step: int, status: str = "running") -> Any:
    x = np.arange(step, dtype=np.float64)
    curves = {
        "loss": 2.0 / (1.0 + 0.05 * x),
        "loss_smooth": 2.0 / (1.0 + 0.05 * x),
        "lr": np.full(step, 3e-4),
        "grad_norm": 1.0 + 0.5 * np.sin(x / 7.0),
        "step_time": 0.02 + 0.001 * np.cos(x / 5.0),
        "samples_per_s": 6000.0 + 100.0 * np.sin(x / 3.0),
        "cpu_percent": np.full(step, 37.0),
        "process_cpu_percent": np.full(step, 99.0),
        "ram_used_bytes": np.full(step, 8e9),
        "process_rss_bytes": np.full(step, 1e9),
    }
    return make_frame(step, series={k: Series(x, y) for k, y in curves.items()}, status=status)


def mount(page: Any, url: str, state: dict[str, Any]) -> None:
    page.goto(url)
    page.wait_for_function("() => window.hostReady === true", timeout=120_000)
    page.evaluate(
        "([s, id]) => window.hostMount(s, id)", [state["manager_state"], state["model_id"]]
    )
    page.wait_for_selector(".nbm-root [data-field=step]", timeout=120_000)


def painted(page: Any) -> list[int]:
    return list(page.evaluate(f"() => [...document.querySelectorAll('{TRAINING_CANVASES}')]"
                              f".map({_INK_JS})"))  # fmt: skip


def field(page: Any, name: str) -> str:
    return str(page.locator(f".nbm-root [data-field={name}]").first.inner_text())


def console_left(console: list[str]) -> list[str]:
    return [e for e in console if not MANAGER_NOISE.fullmatch(e)]


@pytest.mark.timeout(300)
def test_vscode_widget_manager_renders_and_updates_offline() -> None:
    sync_api = start_browser_test("vscode-failure.png", "vscode-console.log")
    with CommRecorder() as recorder:
        dash = Dashboard("vscode-run", "cpu", 1000, route="thread")
        dash.publish(frame(100))
        state = embed_state(dash.widget)
        recorder.take()
        dash.publish(frame(300))
        update = recorder.take()
        dash.close(frame(400))
        closing = recorder.take()
    # One comm message per refresh, carrying only the traits that changed.
    assert [m[1]["method"] for m in update] == ["update"]
    assert "panel_training" in update[0][1]["state"]

    console: list[str] = []
    outside: list[str] = []
    with serve_manager_page() as url, sync_api.sync_playwright() as p:
        browser, page = open_page(p, console, viewport=(1100, 900))

        def route(r: Any) -> None:
            if r.request.url.startswith("http://127.0.0.1:"):
                r.continue_()
            else:  # offline: VS Code without network, no CDN
                outside.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        try:
            mount(page, url, state)
            assert field(page, "step").startswith("100")
            page.wait_for_function(
                f"() => [...document.querySelectorAll('{TRAINING_CANVASES}')]"
                f".filter(c => ({_INK_JS})(c) > 0).length >= 4",
                timeout=60_000,
            )
            before = chart_png(page)
            page.evaluate("(m) => window.hostApply(m)", update)
            page.wait_for_function(
                "() => document.querySelector('.nbm-root [data-field=step]')"
                ".textContent.startsWith('300')",
                timeout=60_000,
            )
            page.wait_for_timeout(300)  # the redraw is the next animation frame
            page.evaluate("() => new Promise(r => requestAnimationFrame(() => r()))")
            assert chart_png(page) != before, "the loss chart did not redraw on the update"
            inks = painted(page)
            assert len(inks) >= 4 and all(inks), inks
            # The System tab draws too.
            page.locator(".nbm-root .nbm-tab[data-tab=system]").first.click()
            page.wait_for_function(
                "() => [...document.querySelectorAll("
                "'.nbm-root .nbm-panel[data-panel=system] .nbm-chart:not([hidden]) canvas')]"
                f".some(c => ({_INK_JS})(c) > 0)",
                timeout=60_000,
            )
            page.evaluate("(m) => window.hostApply(m)", closing)
            page.wait_for_function(
                "() => document.querySelector('.nbm-root [data-field=status]')"
                ".textContent === 'closed'",
                timeout=60_000,
            )
            assert field(page, "step").startswith("400")
            assert outside == [], outside
            assert console_left(console) == [], console_left(console)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "vscode-failure.png"), full_page=True)
            (ARTIFACTS / "vscode-console.log").write_text("\n".join(console))
            raise
        finally:
            browser.close()


# The Colab stand-in: cell 1 attaches (the dashboard is displayed) and embeds the widget state
# the front end has then; cell 2 trains in one long cell until the dashboard has sent at least
# two updates during it (whether they got through or not) and its header shows a step: a
# condition, bounded, not a count of steps; cell 3 closes and prints what the comm let through.
COLAB_CELLS = [
    """
import json, threading, time
import torch
from torch import nn
import nbmonitor
from tests.ui.hosts import MainThreadOnly, embed_state

comm = MainThreadOnly().__enter__()
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = nbmonitor.attach(model, opt, total_steps=40, interval=0.2)
dash = mon.dashboard()
state = embed_state(dash.widget)
comm.take()
""",
    """
dropped = comm.dropped
deadline = time.monotonic() + 180
step = 0
while time.monotonic() < deadline and (
    step < 40
    or len(comm.messages) + comm.dropped - dropped < 2  # updates sent, got through or not
    or not dash.widget.header.get("step")
):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    mon.log(loss=loss)
    step += 1
    time.sleep(0.02)
during = comm.take()
dropped_during = comm.dropped - dropped
""",
    """
mon.close()
after = comm.take()
print(json.dumps({
    "route": dash.route,
    "state": state,
    "during": during,
    "after": after,
    "dropped_during": dropped_during,
    "steps": step,
}))
""",
]


def run_colab_stand_in(tmp_path: Path, route: str) -> dict[str, Any]:
    tmp_path.mkdir()
    return run_cells(COLAB_CELLS, tmp_path, route, timeout=280)


@pytest.mark.timeout(600)
def test_colab_stand_in_shows_the_training_cell_on_the_main_route(tmp_path: Path) -> None:
    sync_api = start_browser_test("colab-failure.png", "colab-console.log")
    # The stand-in is discriminating: from the sampler thread, every update of the long cell
    # is lost, as on Colab.
    thread = run_colab_stand_in(tmp_path / "thread", "thread")
    assert thread["dropped_during"] >= 2 and thread["during"] == [], thread["dropped_during"]

    main = run_colab_stand_in(tmp_path / "main", "main")
    assert main["dropped_during"] == 0
    updates = [m for m in main["during"] if m[1].get("method") == "update"]
    assert len(updates) >= 2, len(updates)

    # What Colab's output frame would show: the state at display, then what got through.
    console: list[str] = []
    with serve_manager_page() as url, sync_api.sync_playwright() as p:
        browser, page = open_page(p, console, viewport=(1100, 900))
        try:
            mount(page, url, main["state"])
            page.evaluate("(m) => window.hostApply(m)", main["during"])
            mid = int(field(page, "step").split("/")[0].replace(",", ""))
            assert mid > 0, "no step reached the front end during the training cell"
            page.wait_for_function(
                f"() => {{ const c = document.querySelector('{TRAINING_CANVASES}');"
                f" return c && ({_INK_JS})(c) > 0; }}",
                timeout=60_000,
            )
            page.evaluate("(m) => window.hostApply(m)", main["after"])
            page.wait_for_function(
                "() => document.querySelector('.nbm-root [data-field=status]')"
                ".textContent === 'closed'",
                timeout=60_000,
            )
            final = int(field(page, "step").split("/")[0].replace(",", ""))
            assert final == main["steps"] >= mid, (final, main["steps"], mid)
            assert console_left(console) == [], console_left(console)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "colab-failure.png"), full_page=True)
            (ARTIFACTS / "colab-console.log").write_text("\n".join(console))
            raise
        finally:
            browser.close()
