"""Cost of one dashboard publish: Python time and bytes sent, against history length.

The engine's Store holds 10^3..10^6 steps and hands the dashboard decimated series (<= ~2,000
points per line); this measures what one publish then costs on the sampler thread and what it
puts on the wire (JSON + binary buffers, captured where ipywidgets hands them to the comm).

    python benchmarks/publish.py            # table on stdout
    python benchmarks/publish.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import replace
from typing import Any

import numpy as np

from nbmonitor._engine.frame import Frame, LayerFrame, Series
from nbmonitor._engine.store import Store

LINES = (
    "loss",
    "loss_smooth",
    "lr",
    "grad_norm",
    "step_time",
    "samples_per_s",
    "cpu_percent",
    "process_cpu_percent",
    "ram_used_bytes",
    "process_rss_bytes",
    "ram_total_bytes",
)


def build_store(n: int) -> Store:
    rng = np.random.default_rng(0)
    steps = np.arange(n, dtype=np.float64)
    cols = {"step": steps}
    for name in LINES:
        cols[name] = rng.random(n)
    cols["loss"][n // 3] = 100.0
    store = Store()
    names = list(cols)
    chunk = 50_000
    for start in range(0, n, chunk):
        block = np.column_stack([cols[k][start : start + chunk] for k in names])
        store.extend([dict(zip(names, row, strict=True)) for row in block.tolist()])
    return store


def frame_at(store: Store, step: int, layers: LayerFrame | None) -> Frame:
    series = {k: Series(*store.series(k, max_points=2000)) for k in LINES}
    latest = {k: store.last(k) for k in LINES}
    return Frame(
        run="bench",
        backend="cpu",
        status="running",
        step=step,
        total_steps=None,
        elapsed_s=1.0,
        eta_s=float("nan"),
        latest=latest,
        series=series,
        layers=layers,
    )


def measure(n: int, repeats: int, with_layers: bool) -> dict[str, Any]:
    import ipywidgets

    from nbmonitor.ui.dashboard import Dashboard

    sent: list[int] = []

    def _send(self: Any, msg: dict[str, Any], buffers: Any = None) -> None:
        size = len(json.dumps(msg, allow_nan=False))
        sent.append(size + sum(memoryview(b).nbytes for b in buffers or []))

    original = ipywidgets.Widget._send
    ipywidgets.Widget._send = _send
    try:
        store = build_store(n)
        layers = None
        if with_layers:
            rng = np.random.default_rng(1)
            n_layers, n_cols = 50, 500
            layers = LayerFrame(
                names=tuple(f"layer{i}.weight" for i in range(n_layers)),
                steps=np.linspace(0, n, n_cols),
                log10_grad_norm=rng.normal(-2, 1, (n_layers, n_cols)),
                table=tuple(
                    {"name": f"layer{i}.weight", "shape": (64, 64), "numel": 4096,
                     "dtype": "float32", "grad_norm": 0.1, "param_norm": 1.0,
                     "update_ratio": 1e-3, "flags": ()}
                    for i in range(n_layers)
                ),
            )  # fmt: skip
        dash = Dashboard("bench", "cpu", None)
        t0 = time.perf_counter()
        base = frame_at(store, n, layers)
        series_s = time.perf_counter() - t0
        dash.publish(base)  # first publish creates figures; not counted
        times, sizes = [], []
        for i in range(repeats):
            # Each publish moves every line by one new point (x and y change), as a live run
            # does, and the heatmap gains a column: the worst case for bytes on the wire.
            series = {
                k: Series(np.append(s.x[1:], s.x[-1] + i + 1), np.append(s.y[1:], s.y[-1] + i + 1))
                for k, s in base.series.items()
            }
            layer_frame = None
            if layers is not None:
                grid = np.roll(layers.log10_grad_norm, -(i + 1), axis=1)
                layer_frame = replace(layers, log10_grad_norm=grid)
            frame = replace(base, step=n + i + 1, series=series, layers=layer_frame)
            sent.clear()
            t = time.perf_counter()
            dash.publish(frame)
            times.append(time.perf_counter() - t)
            sizes.append(sum(sent))
            n_messages = len(sent)
        return {
            "history_steps": n,
            "layers": with_layers,
            "store_series_ms": round(series_s * 1e3, 2),
            "publish_us_median": round(statistics.median(times) * 1e6),
            "publish_us_p90": round(sorted(times)[int(0.9 * len(times))] * 1e6),
            "bytes_per_publish": int(statistics.median(sizes)),
            "messages_per_publish": n_messages,
        }
    finally:
        ipywidgets.Widget._send = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)
    rows = [measure(10**k, args.repeats, False) for k in (3, 4, 5, 6)]
    rows.append(measure(10**6, args.repeats, True))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return
    print(
        f"{'steps':>9} {'layers':>6} {'store.series ms':>15} {'publish µs (med)':>16}"
        f" {'p90 µs':>8} {'bytes/publish':>13} {'messages':>8}"
    )
    for r in rows:
        print(
            f"{r['history_steps']:>9} {r['layers']!s:>6} {r['store_series_ms']:>15}"
            f" {r['publish_us_median']:>16} {r['publish_us_p90']:>8}"
            f" {r['bytes_per_publish']:>13} {r['messages_per_publish']:>8}"
        )


if __name__ == "__main__":
    main()
