"""Overhead of nbmonitor by paired steps: two identical models, one monitored, stepped in turn.

Block-interleaved runs (``overhead.py``) are at the mercy of a shared VM whose speed drifts by
several percent within seconds. Here model A (monitored, defaults) and model B (a bit-identical
copy without a monitor) alternate step by step (A B, B A, ...), so both see the same machine to
within one step, and the hooks' cost is the ratio of their step times. Halfway the two swap
roles (B monitored, A plain): twins do not run alike (see ``swapped_ratio``), and the two
halves' ratios combined cancel that.

The sampler thread slows whichever step it lands on, monitored or plain alike, so that ratio
leaves it out. Its share is measured on its own: every tick is timed, and the median of
the steps it overlapped is compared with the median of the others; that excess, times the
number of steps hit, over the run's time, is the fraction of training time the sampler took.
The total overhead of attaching is the hooks' ratio plus that share.

    python benchmarks/paired.py                        # mlp20, mlp20_b64, gpt; 60 s each
    python benchmarks/paired.py --tasks mlp20 --seconds 120 --dashboard
    python benchmarks/paired.py --clip 1.0             # a loop that clips its gradients
    python benchmarks/paired.py --export tensorboard prometheus parquet   # exporters on
"""

from __future__ import annotations

import argparse
import json
import resource
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
from nbmonitor._engine import pipeline as _pipeline
from overhead import BOOTSTRAP_RESAMPLES, environment, make_task, train_step

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


def swapped_ratio(
    halves: list[tuple[list[float], list[float]]],
) -> tuple[float, tuple[float, float]]:
    """The ratio (minus 1) of monitored to plain step times, from the two halves of a run in
    which the models swapped roles: each half's ratio of medians, combined geometrically, and
    a 95 % bootstrap interval (the pairs of each half resampled on their own).

    Two models built alike do not run alike: with no monitor at all, the one built first ran
    0.2 to 1.8 % slower than its twin in four runs here (memory placement), which a run that
    always monitors the same model adds to the monitor's cost. Swapped halfway, it cancels.
    """
    rng = np.random.default_rng(0)
    point = 1.0
    resampled = np.ones(BOOTSTRAP_RESAMPLES)
    for monitored, plain in halves:
        n = min(len(monitored), len(plain))
        m, p = np.asarray(monitored[:n]), np.asarray(plain[:n])
        point *= float(np.median(m) / np.median(p))
        rows = rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
        resampled *= np.median(m[rows], axis=1) / np.median(p[rows], axis=1)
    root = 1.0 / len(halves)
    lo, hi = np.quantile(resampled**root, [0.025, 0.975])
    return point**root - 1, (float(lo) - 1, float(hi) - 1)


Task = tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]


def run_half(
    models: dict[str, Task],
    opts: dict[str, torch.optim.Optimizer],
    watched: str,
    seconds: float,
    dashboard: bool,
    tmp: str,
    clip: float | None = None,
    export: tuple[str, ...] = (),
) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """``seconds`` of steps in turn with model ``watched`` monitored (``step_models_in_turn``)."""
    # Prometheus on a port the OS picks: another process may hold the default one.
    exporters = [nbmonitor.export.Prometheus(port=0) if e == "prometheus" else e for e in export]
    mon = nbmonitor.attach(
        models[watched][0], opts[watched], run_dir=tmp, display=False, export=exporters
    )
    if mon.errors:
        raise SystemExit(f"an exporter did not start: {mon.errors}")
    if dashboard:
        mon.dashboard()  # what a notebook shows, without a front end (display=False: no other view)
    return step_models_in_turn(models, opts, {watched: mon}, seconds, clip)


def step_models_in_turn(
    models: dict[str, Task],
    opts: dict[str, torch.optim.Optimizer],
    mons: dict[str, Any],
    seconds: float,
    clip: float | None = None,
) -> tuple[dict[str, list[float]], list[tuple[float, float]]]:
    """``seconds`` of models "A" and "B" trained in turn, each logging its loss to its monitor
    in ``mons`` if it has one (closed at the end): each model's step times, and the span of
    every step (for the sampler's share)."""
    times: dict[str, list[float]] = {"A": [], "B": []}
    spans: list[tuple[float, float]] = []

    def step(which: str) -> None:
        model, loss_fn = models[which]
        opt = opts[which]
        mon = mons.get(which)
        start = time.perf_counter()
        train_step(model, loss_fn, opt, mon, clip)
        end = time.perf_counter()
        times[which].append(end - start)
        spans.append((start, end))

    def warmed() -> None:
        times["A"].clear()
        times["B"].clear()
        spans.clear()

    try:
        step_in_turn(step, seconds, warmed)
    finally:
        for mon in mons.values():
            mon.close()
    return times, spans


def measure(
    task: str,
    seconds: float,
    dashboard: bool,
    tmp: str,
    clip: float | None = None,
    export: tuple[str, ...] = (),
) -> dict[str, Any]:
    models = {"A": make_task(task), "B": make_task(task)}  # same seed: same weights and data
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, (m, _) in models.items()}
    ticks: list[tuple[float, float]] = []
    original = _pipeline.Pipeline.tick

    def timed_tick(self: _pipeline.Pipeline, paced: bool) -> None:
        start = time.perf_counter()
        original(self, paced)
        ticks.append((start, time.perf_counter()))

    _pipeline.Pipeline.tick = timed_tick  # type: ignore[method-assign]
    halves: list[tuple[list[float], list[float]]] = []
    spans: list[tuple[float, float]] = []
    faults_per_step: list[float] = []
    try:
        for watched, plain in (("A", "B"), ("B", "A")):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            times, half_spans = run_half(
                models, opts, watched, seconds / 2, dashboard, tmp, clip, export
            )
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            halves.append((times[watched], times[plain]))
            spans += half_spans
            # Process-wide, attach and warm-up included (a small share over a minute or more).
            # Hundreds of page faults per step mean glibc is trimming the heap every step (both
            # models alike in count, not always in time; benchmarks/NOTES.md, "The heap"): a run to
            # read with that in mind.
            faults_per_step.append(faults / max(1, len(half_spans)))
    finally:
        _pipeline.Pipeline.tick = original  # type: ignore[method-assign]

    monitored = [t for m, _ in halves for t in m]
    plain_times = [t for _, p in halves for t in p]
    hooks, (hooks_lo, hooks_hi) = swapped_ratio(halves)
    # The sampler slows whichever step it lands on, monitored or not: the excess of the steps
    # a tick overlapped over the others, times their number, over the run's time.
    durations = [e - s for s, e in spans]
    hits = [any(ts < e and te > s for ts, te in ticks) for s, e in spans]
    on = [t for t, h in zip(durations, hits, strict=True) if h]
    off = [t for t, h in zip(durations, hits, strict=True) if not h]
    excess = 0.0
    if on and off:
        # Medians, not means: a step that the VM stalls is no more the sampler's doing when a
        # tick happens to overlap it.
        excess = len(on) * max(0.0, statistics.median(on) - statistics.median(off))
    sampler = excess / sum(durations)
    pair_ratios = [x / y for m, p in halves for x, y in zip(m, p, strict=False)]
    q1, _, q3 = statistics.quantiles(pair_ratios, n=4)
    return {
        "pairs": len(pair_ratios),
        "step_ms_monitored": statistics.median(monitored) * 1e3,
        "step_ms_plain": statistics.median(plain_times) * 1e3,
        "hooks_percent": hooks * 100,
        "hooks_percent_ci95": [hooks_lo * 100, hooks_hi * 100],
        "halves_percent": [
            (statistics.median(m) / statistics.median(p) - 1) * 100 for m, p in halves
        ],
        "pair_ratio_median_percent": (statistics.median(pair_ratios) - 1) * 100,
        "pair_ratio_iqr_percent": [(q1 - 1) * 100, (q3 - 1) * 100],
        "ticks": len(ticks),
        "tick_ms_median": statistics.median(e - s for s, e in ticks) * 1e3 if ticks else 0.0,
        "steps_hit_by_ticks": len(on),
        "sampler_percent": sampler * 100,
        "total_percent": (hooks + sampler) * 100,
        "page_faults_per_step_halves": faults_per_step,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["mlp20", "mlp20_b64", "gpt"])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--dashboard", action="store_true", help="the notebook dashboard as view")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--clip", type=float, help="clip_grad_norm_ to this norm every step")
    ap.add_argument(
        "--export", nargs="*", default=[], help="attach(export=...) targets, e.g. tensorboard"
    )
    args = ap.parse_args()
    results: dict[str, Any] = {
        **environment(),
        "view": "dashboard" if args.dashboard else "console",
        "clip": args.clip,
        "export": args.export,
        "tasks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            r = measure(task, args.seconds, args.dashboard, tmp, args.clip, tuple(args.export))
            results["tasks"][task] = r
            print(
                f"{task:10s} {r['pairs']} pairs, plain {r['step_ms_plain']:.2f} ms: "
                f"hooks {r['hooks_percent']:+.2f} % (95 % CI {r['hooks_percent_ci95'][0]:+.2f}.."
                f"{r['hooks_percent_ci95'][1]:+.2f}; halves {r['halves_percent'][0]:+.2f}, "
                f"{r['halves_percent'][1]:+.2f} %, "
                f"pairs IQR {r['pair_ratio_iqr_percent'][0]:+.1f}.."
                f"{r['pair_ratio_iqr_percent'][1]:+.1f}), sampler {r['sampler_percent']:.2f} % "
                f"({r['ticks']} ticks, median {r['tick_ms_median']:.2f} ms) "
                f"= total {r['total_percent']:+.2f} %; page faults per step "
                f"{r['page_faults_per_step_halves'][0]:.0f}, "
                f"{r['page_faults_per_step_halves'][1]:.0f}",
                file=sys.stderr,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
