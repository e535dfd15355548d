"""Each panel of the dashboard, drawn from a fixed Frame in a bare page (tests/ui/harness.py)
by Debian's chromium, against a committed baseline PNG with a tolerance: a change in layout,
axes, legends or colours shows as a failed comparison. Regenerate the baselines after an
intended change with NBMONITOR_UPDATE_BASELINES=1 and look at them."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from tests.ui.harness import serve_page, widget_payload
from tests.ui.test_browser import BROWSER_ARGS, CHROMIUM, _require_browser, assert_console_clean

from nbmonitor._engine.frame import (
    Frame,
    GanttBar,
    LayerFrame,
    MemoryTable,
    Series,
    TimelineFrame,
)
from nbmonitor.ui.dashboard import Dashboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BASELINES = Path(__file__).resolve().parent / "baselines"
PANELS = ("training", "system", "memory", "layers", "timeline")
# A pixel differs when its channels differ by more than this in sum; a panel matches while at
# most MAX_DIFF of its pixels differ (antialiasing and font hinting move a few).
PIXEL_DELTA = 60
MAX_DIFF = 0.02


def fixed_frame(n: int = 1_000) -> Frame:
    rng = np.random.default_rng(7)
    x = np.arange(1.0, n + 1)
    loss = 1.2 * np.exp(-x / 250) + 0.3 + 0.05 * rng.standard_normal(n)
    smooth = np.convolve(loss, np.ones(25) / 25, mode="same")
    warm = np.minimum(1.0, x / 50) * (0.1 + 0.45 * (1 + np.cos(np.pi * x / n)))
    step = 0.045 + 0.004 * rng.standard_normal(n)
    s = {
        "loss": Series(x, loss),
        "loss_smooth": Series(x, smooth),
        "lr": Series(x, 3e-3 * warm),
        "grad_norm": Series(x, np.exp(rng.normal(0, 0.5, n)) * 2.0),
        "step_time_median": Series(x[::10], step[::10]),
        "step_time_min": Series(x[::10], step[::10] - 0.006),
        "step_time_max": Series(x[::10], step[::10] + 0.02),
        "samples_per_s": Series(x, 128 / step),
        "samples_per_s_smooth": Series(x[::10], 128 / step[::10]),
        "cpu_percent": Series(x, 60 + 10 * np.sin(x / 50)),
        "process_cpu_percent": Series(x, 150 + 20 * np.cos(x / 70)),
        "ram_used_bytes": Series(x, 7.5 * 2**30 + 2**28 * np.sin(x / 200)),
        "process_rss_bytes": Series(x, 1.2 * 2**30 + 2**20 * x / 10),
        "gpu0_util_percent": Series(x, 85 + 5 * np.sin(x / 30)),
        "gpu0_mem_used_bytes": Series(x, np.full(n, 40e9)),
        "gpu0_power_w": Series(x, 300 + 20 * np.sin(x / 40)),
        # The memory panel's: a saw of activations over the fixed 24 GiB, a leak-free run.
        "cuda_allocated_bytes": Series(x, (24 + 6 * (x % 50 < 25)) * 2**30),
        "cuda_reserved_bytes": Series(x, np.full(n, 40.0 * 2**30)),
        "cuda_interval_peak_bytes": Series(x, (36 + 0.5 * np.sin(x / 90)) * 2**30),
        "cuda_inactive_split_bytes": Series(x, (0.5 + 0.25 * np.sin(x / 60)) * 2**30),
    }
    names = [
        f"blocks.{i // 2}.attn.out_proj.{'weight' if i % 2 == 0 else 'bias'}" for i in range(8)
    ]
    grid = rng.normal(-2.0, 0.6, (8, 120))
    table = tuple(
        {"name": name, "shape": (64, 64) if "weight" in name else (64,), "numel": 4096,
         "dtype": "float32", "grad_norm": float(10 ** grid[i, -1]), "param_norm": 1.0,
         "update_ratio": 1e-3, "flags": ("exploding",) if i == 3 else ()}
        for i, name in enumerate(names)
    )  # fmt: skip
    phases = ("data", "forward", "backward", "other", "optimizer")
    seconds = np.vstack(
        [np.full(200, v) + 0.001 * rng.random(200) for v in (8e-3, 0.012, 0.02, 1e-3, 4e-3)]
    )
    gantt = []
    t = 100.0
    for k in range(3):
        for name, d in zip(phases, (8e-3, 0.012, 0.02, 1e-3, 4e-3), strict=True):
            gantt.append(GanttBar("phases", name, 998 + k, t, d))
            t += d
        gantt.append(GanttBar("spans", "load_batch", 998 + k, t - 0.045, 0.007))
    summary = (
        {"name": "backward", "kind": "phase", "count": 1000, "mean_s": 0.02, "median_s": 0.02,
         "std_s": 0.001, "min_s": 0.018, "max_s": 0.03, "total_s": 20.0, "percent": 44.4},
        {"name": "load_batch", "kind": "span", "count": 1000, "mean_s": 0.007, "median_s": 0.007,
         "std_s": 0.0005, "min_s": 0.006, "max_s": 0.01, "total_s": 7.0, "percent": 15.6},
    )  # fmt: skip
    device = {"name": "H100", "util_percent": 88.0, "mem_used_bytes": 40e9,
              "mem_total_bytes": 80e9, "temperature_c": 61.0, "power_w": 310.0,
              "power_limit_w": 700.0, "throttle": ""}  # fmt: skip
    return Frame(
        run="screenshot-run",
        backend="cuda",
        status="running",
        step=n,
        total_steps=2 * n,
        elapsed_s=45.0,
        eta_s=45.0,
        latest={
            "loss": 0.31,
            "best_loss": 0.29,
            "samples_per_s": 2800.0,
            "step_time": 0.045,
            "cpu_percent": 62.0,
            "process_cpu_percent": 150.0,
            "ram_used_bytes": 7.5 * 2**30,
            "ram_total_bytes": 16 * 2**30,
            "process_rss_bytes": 1.3 * 2**30,
            "gpu0_mem_total_bytes": 80e9,
            "memory_peak_bytes": 37.0 * 2**30,
            "memory_limit_bytes": 78.0 * 2**30,
            "batch_size": 32.0,
            "batch_fits": 96.0,
        },
        series=s,
        devices=(device,),
        layers=LayerFrame(tuple(names), np.linspace(1, n, 120), grid, table),
        timeline=TimelineFrame(phases, np.linspace(800, n, 200), seconds, tuple(gantt), summary),
        memory=MEMORY,
    )


GIB = 2.0**30
MEMORY = MemoryTable(
    990,
    990,
    (
        {"device": "cuda:0", "parameters": 6 * GIB, "buffers": 2.0**20, "gradients": 6 * GIB,
         "optimizer_state": 12 * GIB, "activations": 9.5 * GIB, "measured": 36.2 * GIB,
         "measured_what": "peak of the last interval", "other": 2.7 * GIB},
        {"device": "cpu", "parameters": 0.0, "buffers": 0.0, "gradients": 0.0,
         "optimizer_state": 0.0, "activations": 0.0, "measured": 1.3 * GIB,
         "measured_what": "resident size", "other": 1.3 * GIB},
    ),
)  # fmt: skip


def differing(a: bytes, b: bytes) -> float:
    """The share of pixels that differ by more than PIXEL_DELTA; 1.0 for other sizes."""
    from PIL import Image, ImageChops

    ia = Image.open(io.BytesIO(a)).convert("RGB")
    ib = Image.open(io.BytesIO(b)).convert("RGB")
    if ia.size != ib.size:
        return 1.0
    diff = np.asarray(ImageChops.difference(ia, ib), dtype=np.int32).sum(axis=2)
    return float((diff > PIXEL_DELTA).mean())


@pytest.mark.timeout(240)
def test_each_panel_matches_its_baseline() -> None:
    pytest.importorskip("PIL")
    sync_api = _require_browser()
    dash = Dashboard("screenshot-run", "cuda", 2000)
    dash.publish(fixed_frame())
    payload = widget_payload(dash.widget)
    update = os.environ.get("NBMONITOR_UPDATE_BASELINES") == "1"
    console: list[str] = []
    failures = []
    with serve_page() as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1020, "height": 900})
            page.on(
                "console",
                lambda m: (
                    console.append(f"{m.type}: {m.text}")
                    if m.type in ("error", "warning")
                    else None
                ),
            )
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(url)
            page.wait_for_function("() => window.nbmReady === true")
            page.evaluate("(p) => window.nbmMount(p)", payload)
            for name in PANELS:
                page.locator(f".nbm-tab[data-tab={name}]").click()
                page.wait_for_timeout(300)  # the ResizeObserver sizes the charts of the tab
                shot = page.locator(f".nbm-panel[data-panel={name}]").screenshot()
                baseline = BASELINES / f"panel-{name}.png"
                if update:
                    BASELINES.mkdir(exist_ok=True)
                    baseline.write_bytes(shot)
                    continue
                assert baseline.is_file(), (
                    f"no baseline {baseline.name}: run with NBMONITOR_UPDATE_BASELINES=1"
                )
                share = differing(shot, baseline.read_bytes())
                if share > MAX_DIFF:
                    out = ROOT_ARTIFACTS / f"panel-{name}.png"
                    out.parent.mkdir(exist_ok=True)
                    out.write_bytes(shot)
                    failures.append(f"{name}: {share:.1%} of pixels differ (see {out})")
        finally:
            browser.close()
    assert not failures, failures
    assert_console_clean(console)


ROOT_ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
