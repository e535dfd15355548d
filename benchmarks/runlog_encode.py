"""The run log's worker, per row: what encoding a tick's rows (and their sidecar columns) costs,
and what of it is the floats' repr, which no encoder of the same bytes escapes.

    python -m benchmarks.runlog_encode --rows 700 --rounds 7

Rows like a ``tiny`` step's (18 keys: step, five phases, time, step_time, constant counts, lr,
throughput, a NaN MFU, norms and losses with 17 significant digits) and like an ``mlp50`` tick's
layers rows (four rows of 201 norms and ratios, one of 101 gradient norms). Timed in thread
CPU, alternated round after round, medians with min-max:

* ``json``: ``encode_lines`` (the json module's encoder, one line a row) and ``to_columns``,
  as the run log did before issue 29's fourth session;
* ``template``: ``LineEncoder.encode(rows, columns=True)`` (nbmonitor/runs/encode.py), the
  same bytes (checked here too);
* ``repr floor``: ``repr`` of every value, nothing else.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable

from nbmonitor.runs.decode import to_columns
from nbmonitor.runs.encode import LineEncoder
from nbmonitor.runs.format import encode_lines


def step_rows(n: int, rng: random.Random) -> list[dict[str, float]]:
    t0 = 1.79e9 + rng.random()
    rows = []
    for i in range(n):
        phases = [rng.uniform(2e-5, 6e-4) for _ in range(5)]
        step_time = sum(phases)
        rows.append(
            {
                "step": float(i),
                "phase_data_s": phases[0],
                "phase_forward_s": phases[1],
                "phase_backward_s": phases[2],
                "phase_other_s": phases[3],
                "phase_optimizer_s": phases[4],
                "time": t0 + i * step_time,
                "step_time": step_time,
                "micro_batches": 1.0,
                "samples": 4.0,
                "samples_per_s": 4.0 / step_time,
                "flops_per_step": 1728.0,
                "tflops_per_s": 1728.0 / step_time / 1e12,
                "mfu_percent": math.nan,
                "lr": 1e-4,
                "grad_norm": rng.uniform(0.1, 1.0),
                "loss": rng.uniform(0.1, 0.2),
                "loss_smooth": rng.uniform(0.1, 0.2),
            }
        )
    return rows


def layer_rows(rng: random.Random, layers: int = 100) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for step in range(4):
        row = {"step": float(step * 10)}
        for layer in range(layers):
            row[f"param_norm/{2 * layer}.weight"] = rng.uniform(1, 5)
            row[f"update_ratio/{2 * layer}.weight"] = rng.uniform(1e-7, 1e-3)
        rows.append(row)
    grads = {"step": 30.0}
    grads.update((f"grad_norm/{2 * layer}.weight", rng.uniform(0, 1)) for layer in range(layers))
    return [*rows, grads]


def _cpu(fn: Callable[[], object]) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=700, help="step rows a tick")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(0)
    for name, rows in (("steps", step_rows(args.rows, rng)), ("layers", layer_rows(rng))):
        encoder = LineEncoder()
        assert encoder.encode(rows)[0] == encode_lines(rows)  # and the templates are built
        values = [v for r in rows for v in r.values()]
        ways: dict[str, Callable[[], object]] = {
            "json": lambda rows=rows: (encode_lines(rows), to_columns(rows)),
            "template": lambda rows=rows, e=encoder: e.encode(rows, columns=True),
            "repr floor": lambda values=values: list(map(repr, values)),
        }
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                times[way].append(_cpu(fn))
        print(f"{name}: {len(rows)} rows of {len(values) // len(rows)} values, thread CPU")
        for way, ts in times.items():
            med = statistics.median(ts)
            print(
                f"  {way:10s} {med * 1e3:7.3f} ms ({min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f})"
                f"  {med / len(rows) * 1e6:7.2f} us a row"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
