"""The browser's frame time of one dashboard refresh, at 1,000 and 1,000,000 steps of history;
with ``--before``, the same for an earlier revision's dashboard (the bqplot one), interleaved.

Each revision's ``Dashboard`` publishes frames built from a Store of n steps (decimated series,
as the engine builds them; ``benchmarks/publish.py`` of that revision) in a subprocess that
imports that revision: the widget state ipywidgets embeds, then one comm message list per
refresh, each refresh moving every curve by one point, captured where ipywidgets hands them to
the comm. The page is a real ipywidgets widget manager in Debian's chromium
(``tests/ui/hosts.py``: ``@jupyter-widgets/html-manager``, with anywidget, bqplot and bqscales
loaded from the environment's nbextensions), and a refresh's time runs from handing its
messages to the models' comm handler to the start of the frame after the one that draws them
(the redraws, then style, layout and paint; chromium runs without its frame-rate limit, so no
vsync wait is counted). One page per (revision, size), all refreshes interleaved round by round
so that a busy machine weighs on all alike; an empty refresh (no message) is timed as well, the
floor of the measure.

    python benchmarks/frame_time.py
    git archive 5540f64 | tar -x -C /tmp/old && (cd /tmp/old/js && npm ci && npm run build)
    python benchmarks/frame_time.py --before /tmp/old      # the bqplot dashboard too
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-frame-rate-limit",
    "--disable-gpu-vsync",
]
SIZES = (1_000, 1_000_000)


def _hosts() -> Any:
    """tests/ui/hosts.py of this checkout, whatever revision the subprocess imports."""
    spec = importlib.util.spec_from_file_location("nbm_hosts", ROOT / "tests" / "ui" / "hosts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def emit(n: int, count: int, out: Path) -> None:
    """In the subprocess: the embedded state and ``count`` refreshes' messages, as JSON."""
    from dataclasses import replace

    import numpy as np
    from benchmarks.publish import build_store, frame_at

    from nbmonitor._engine.frame import Series
    from nbmonitor.ui.dashboard import Dashboard

    hosts = _hosts()
    store = build_store(n)
    base = frame_at(store, n, None)
    with hosts.CommRecorder() as recorder:
        dash = Dashboard("bench", "cpu", None)
        dash.publish(base)
        state = hosts.embed_state(dash.widget)
        recorder.take()
        refreshes = []
        for i in range(count):
            series = {
                k: Series(np.append(s.x[1:], s.x[-1] + i + 1), np.append(s.y[1:], s.y[-1] + i + 1))
                for k, s in base.series.items()
            }
            dash.publish(replace(base, step=n + i + 1, series=series))
            refreshes.append(recorder.take())
    points = len(base.series["loss"].x)
    out.write_text(json.dumps({"state": state, "refreshes": refreshes, "points": points}))


def payloads(tree: Path, n: int, count: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nbm-frame-") as tmp:
        out = Path(tmp) / "payload.json"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run(
            [sys.executable, __file__, "--emit", str(n), str(count), str(out)],
            cwd=tree,
            env=env,
            check=True,
        )
        data: dict[str, Any] = json.loads(out.read_text())
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--before", type=Path, help="an earlier revision's checkout, built")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--emit", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.emit:
        emit(int(args.emit[0]), int(args.emit[1]), Path(args.emit[2]))
        return
    from playwright.sync_api import sync_playwright

    hosts = _hosts()
    trees = {"now": ROOT}
    if args.before:
        trees["before"] = args.before.resolve()
    total = args.rounds * args.per_round
    configs = [(name, n) for name in trees for n in SIZES]
    data = {c: payloads(trees[c[0]], c[1], total) for c in configs}
    times: dict[tuple[str, int], list[float]] = {c: [] for c in configs}
    empty: list[float] = []
    load = [os.getloadavg()[0]]
    with hosts.serve_manager_page() as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages = {}
        for c in configs:
            page = browser.new_page(viewport={"width": 1020, "height": 1400})
            page.goto(url)
            page.wait_for_function("() => window.hostReady === true", timeout=120_000)
            state = data[c]["state"]
            page.evaluate(
                "([s, id]) => window.hostMount(s, id)", [state["manager_state"], state["model_id"]]
            )
            page.wait_for_timeout(1000)
            pages[c] = page
        for r in range(args.rounds):
            for c in configs:
                for k in range(args.per_round):
                    messages = data[c]["refreshes"][r * args.per_round + k]
                    times[c].append(pages[c].evaluate("(m) => window.hostFrameMs(m)", messages))
                empty.append(pages[c].evaluate("() => window.hostFrameMs([])"))
            load.append(os.getloadavg()[0])
            time.sleep(0.2)
        browser.close()

    def row(t: list[float]) -> dict[str, float]:
        t = sorted(t)
        return {
            "frame_ms_median": round(statistics.median(t), 1),
            "frame_ms_p10": round(t[len(t) // 10], 1),
            "frame_ms_p90": round(t[int(len(t) * 0.9)], 1),
        }

    rows = [
        {
            "revision": name,
            "history_steps": n,
            "points_per_curve": data[(name, n)]["points"],
            "messages_per_refresh": len(data[(name, n)]["refreshes"][0]),
            "refreshes": len(times[(name, n)]),
            **row(times[(name, n)]),
        }
        for name, n in configs
    ]
    result = {"rows": rows, "empty_refresh": row(empty), "load_average": load}
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    head = ("revision", "steps", "points", "msgs", "median ms", "p10", "p90")
    print(" ".join(f"{h:>9}" for h in head))
    for r in rows:
        print(
            f"{r['revision']:>9} {r['history_steps']:>9} {r['points_per_curve']:>9}"
            f" {r['messages_per_refresh']:>9} {r['frame_ms_median']:>9}"
            f" {r['frame_ms_p10']:>9} {r['frame_ms_p90']:>9}"
        )
    e = result["empty_refresh"]
    print(
        f"empty refresh: median {e['frame_ms_median']} ms"
        f" (p10 {e['frame_ms_p10']}, p90 {e['frame_ms_p90']})"
    )
    print("load average (1 min) per round:", " ".join(f"{x:.1f}" for x in load))


if __name__ == "__main__":
    main()
