"""The browser's cost of one dashboard refresh, against history length: 1,000 vs 1,000,000 steps.

A Dashboard publishes frames built from a Store of n steps (decimated series, as the engine
builds them); the front end runs in Debian's chromium in a bare page (tests/ui/harness.py) and
each refresh sets the changed traits and times the view's redraw callback (every chart of the
training panel, where the curves are, redrawn by uPlot in its canvas). The sizes are
interleaved, round by round, so that a busy machine weighs on both alike.

    python benchmarks/frame_time.py            # table on stdout
    python benchmarks/frame_time.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.publish import build_store, frame_at
from tests.ui.harness import serve_page, widget_payload

from nbmonitor._engine.frame import Series
from nbmonitor.ui.dashboard import Dashboard

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def payloads(n: int, count: int) -> list[dict[str, object]]:
    """The first state and ``count`` refreshes, each moving every curve by one point."""
    store = build_store(n)
    base = frame_at(store, n, None)
    dash = Dashboard("bench", "cpu", None)
    dash.publish(base)
    out = [widget_payload(dash.widget)]
    for i in range(count):
        series = {
            k: Series(np.append(s.x[1:], s.x[-1] + i + 1), np.append(s.y[1:], s.y[-1] + i + 1))
            for k, s in base.series.items()
        }
        dash.publish(replace(base, step=n + i + 1, series=series))
        out.append(widget_payload(dash.widget, ("header", "panel_training", "panel_system")))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    sizes = (1_000, 1_000_000)
    total = args.rounds * args.per_round
    states = {n: payloads(n, total) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with serve_page() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages = {}
        for n in sizes:
            page = browser.new_page(viewport={"width": 1020, "height": 900})
            page.goto(url)
            page.wait_for_function("() => window.nbmReady === true")
            page.evaluate("(p) => window.nbmMount(p)", states[n][0])
            page.wait_for_timeout(500)
            pages[n] = page
        for r in range(args.rounds):
            for n in sizes:
                for k in range(args.per_round):
                    payload = states[n][1 + r * args.per_round + k]
                    times[n].append(pages[n].evaluate("(p) => window.nbmRefreshMs(p)", payload))
        browser.close()
    rows = []
    for n in sizes:
        t = sorted(times[n])
        points = int(states[n][1]["state"]["panel_training"]["series"]["loss"]["x"]["shape"][0])
        rows.append(
            {
                "history_steps": n,
                "points_per_curve": points,
                "refreshes": len(t),
                "redraw_ms_median": round(statistics.median(t), 2),
                "redraw_ms_p10": round(t[len(t) // 10], 2),
                "redraw_ms_p90": round(t[int(len(t) * 0.9)], 2),
            }
        )
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(f"{'steps':>9} {'points':>7} {'n':>4} {'median ms':>10} {'p10':>7} {'p90':>7}")
    for r in rows:
        print(
            f"{r['history_steps']:>9} {r['points_per_curve']:>7} {r['refreshes']:>4}"
            f" {r['redraw_ms_median']:>10} {r['redraw_ms_p10']:>7} {r['redraw_ms_p90']:>7}"
        )


if __name__ == "__main__":
    main()
