"""A run written by another process, with nbmonitor's own run log (no torch): step rows with
loss, grad norm, step time and throughput, one alert, then close (or stay open while the file
``hold`` exists next to the runs).

    python run_writer.py ROOT NAME STEPS [--delay S] [--total N] [--hold]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import time

from nbmonitor.sinks import Batch
from nbmonitor.sinks.runlog import RunLogSink


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("steps", type=int)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--total", type=int, default=None)
    p.add_argument("--hold", action="store_true")
    args = p.parse_args()
    start = time.time()
    meta = {"start_timestamp": start, "attach": {"total_steps": args.total}}
    log = RunLogSink.create(args.root, args.name, meta)
    print(log.path, flush=True)
    for step in range(1, args.steps + 1):
        now = time.time()
        row = {
            "step": step,
            "time": now,
            "loss": 2.0 * math.exp(-step / 50),
            "grad_norm": 1.0 + 0.01 * step,
            "step_time": 0.01,
            "samples_per_s": 6400.0,
        }
        streams: dict[str, list[dict[str, object]]] = {"steps": [row]}
        if step == 3:
            streams["events"] = [
                {"rule": "loss_spike", "severity": "warning", "message": "loss spiked at 3",
                 "step": 3, "time": now, "layers": [], "subject": "loss"}
            ]  # fmt: skip
        log.write(Batch(streams))
        log.flush()
        time.sleep(args.delay)
    hold = pathlib.Path(args.root) / "hold"
    while args.hold and hold.exists():
        time.sleep(0.05)
    log.close({"status": "closed", "steps": args.steps, "end_time": "x"})


if __name__ == "__main__":
    main()
