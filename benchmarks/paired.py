"""Overhead of nbmonitor by paired steps: two identical models, one monitored, stepped in turn.

Block-interleaved runs (``overhead.py``) are at the mercy of a shared VM whose speed drifts by
several percent within seconds. Here model A (monitored, defaults) and model B (a bit-identical
copy without a monitor) alternate step by step (A B, B A, ...), so both see the same machine to
within one step, and the hooks' cost is the ratio of their step times.

The sampler thread, started for A, slows whichever step it lands on, A's or B's alike, so that
ratio leaves it out. Its share is measured on its own: every tick is timed, and the median of
the steps it overlapped is compared with the median of the others; that excess, times the
number of steps hit, over the run's time, is the fraction of training time the sampler took.
The total overhead of attaching is the hooks' ratio plus that share.

    python benchmarks/paired.py                        # mlp20, mlp20_b64, gpt; 60 s each
    python benchmarks/paired.py --tasks mlp20 --seconds 120 --dashboard
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbmonitor
from nbmonitor import _monitor
from overhead import environment, make_task, median_ci

WARMUP_PAIRS = 20


def step_in_turn(step: Callable[[str], None], seconds: float, warmed: Callable[[], None]) -> None:
    """Steps "A" and "B" in turn (A B, B A, ...) for ``seconds``; ``warmed()`` is called after
    the first WARMUP_PAIRS pairs, whose timings are to be dropped."""
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline or i < WARMUP_PAIRS * 2:
        for which in ("A", "B") if i % 2 == 0 else ("B", "A"):
            step(which)
        i += 1
        if i == WARMUP_PAIRS:
            warmed()


def measure(task: str, seconds: float, dashboard: bool, tmp: str) -> dict[str, Any]:
    model_a, loss_a = make_task(task)
    model_b, loss_b = make_task(task)  # same seed: the same weights and data
    opt_a = torch.optim.AdamW(model_a.parameters(), lr=1e-4)
    opt_b = torch.optim.AdamW(model_b.parameters(), lr=1e-4)
    ticks: list[tuple[float, float]] = []
    original = _monitor.Monitor._tick

    def timed_tick(self: _monitor.Monitor, paced: bool) -> None:
        start = time.perf_counter()
        original(self, paced)
        ticks.append((start, time.perf_counter()))

    _monitor.Monitor._tick = timed_tick  # type: ignore[method-assign]
    mon = nbmonitor.attach(model_a, opt_a, run_dir=tmp, display=False)
    if dashboard:
        mon._views = (mon._make_dashboard(),)  # what a notebook shows, without a front end
    spans: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}

    def step(which: str) -> None:
        model, loss_fn, opt = (model_a, loss_a, opt_a) if which == "A" else (model_b, loss_b, opt_b)
        start = time.perf_counter()
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if which == "A":
            mon.log(loss=loss)
        spans[which].append((start, time.perf_counter()))

    def warmed() -> None:
        spans["A"].clear()
        spans["B"].clear()
        ticks.clear()

    try:
        step_in_turn(step, seconds, warmed)
    finally:
        mon.close()
        _monitor.Monitor._tick = original  # type: ignore[method-assign]

    a = [e - s for s, e in spans["A"]]
    b = [e - s for s, e in spans["B"]]
    pair_ratios = [x / y for x, y in zip(a, b, strict=False)]
    excess = 0.0
    hit = 0
    for which, times in (("A", a), ("B", b)):
        hits = [any(ts < e and te > s for ts, te in ticks) for s, e in spans[which]]
        on = [t for t, h in zip(times, hits, strict=True) if h]
        off = [t for t, h in zip(times, hits, strict=True) if not h]
        if on and off:
            # Medians, not means: a step that the VM stalls is no more the sampler's doing
            # when a tick happens to overlap it.
            hit += len(on)
            excess += len(on) * max(0.0, statistics.median(on) - statistics.median(off))
    total = sum(a) + sum(b)
    hooks = statistics.median(a) / statistics.median(b) - 1
    sampler = excess / total
    q1, _, q3 = statistics.quantiles(pair_ratios, n=4)
    # Resampling pairs keeps each A step with the B step beside it: the VM's drift cancels.
    av, bv = np.asarray(a), np.asarray(b[: len(a)])
    hooks_lo, hooks_hi = median_ci(
        lambda rows: np.median(av[rows], axis=1) / np.median(bv[rows], axis=1) - 1, len(av)
    )
    return {
        "pairs": len(a),
        "step_ms_monitored": statistics.median(a) * 1e3,
        "step_ms_plain": statistics.median(b) * 1e3,
        "hooks_percent": hooks * 100,
        "hooks_percent_ci95": [hooks_lo * 100, hooks_hi * 100],
        "hooks_percent_mean": (statistics.fmean(a) / statistics.fmean(b) - 1) * 100,
        "pair_ratio_median_percent": (statistics.median(pair_ratios) - 1) * 100,
        "pair_ratio_iqr_percent": [(q1 - 1) * 100, (q3 - 1) * 100],
        "ticks": len(ticks),
        "tick_ms_median": statistics.median(e - s for s, e in ticks) * 1e3 if ticks else 0.0,
        "steps_hit_by_ticks": hit,
        "sampler_percent": sampler * 100,
        "total_percent": (hooks + sampler) * 100,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["mlp20", "mlp20_b64", "gpt"])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--dashboard", action="store_true", help="the notebook dashboard as view")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    results: dict[str, Any] = {
        **environment(),
        "view": "dashboard" if args.dashboard else "console",
        "tasks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            r = measure(task, args.seconds, args.dashboard, tmp)
            results["tasks"][task] = r
            print(
                f"{task:10s} {r['pairs']} pairs, plain {r['step_ms_plain']:.2f} ms: "
                f"hooks {r['hooks_percent']:+.2f} % (95 % CI {r['hooks_percent_ci95'][0]:+.2f}.."
                f"{r['hooks_percent_ci95'][1]:+.2f}, mean {r['hooks_percent_mean']:+.2f} %, "
                f"pairs IQR {r['pair_ratio_iqr_percent'][0]:+.1f}.."
                f"{r['pair_ratio_iqr_percent'][1]:+.1f}), sampler {r['sampler_percent']:.2f} % "
                f"({r['ticks']} ticks, median {r['tick_ms_median']:.2f} ms) "
                f"= total {r['total_percent']:+.2f} %",
                file=sys.stderr,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
