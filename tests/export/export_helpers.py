"""A run on disk made without torch for the export tests, and the check that an exported copy,
read back by the tool's own reader, equals ``run.history()`` (and ``system()``, ``layers()``)
for every key and step."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

import nbmonitor
from nbmonitor.sinks import Batch, RunLogSink
from nbmonitor.sinks.exporter import PREFIX

STEPS = 2500  # more than one BATCH_ROWS batch when read back
Exported = Mapping[str, Sequence[tuple[int, float]]]


def make_run(root: pathlib.Path, name: str = "export", *, close: bool = True) -> pathlib.Path:
    """A run with every numeric stream: a NaN loss, a key logged every 10th step, system
    samples that share steps, layer rows every 50 steps, and a few events."""
    log = RunLogSink.create(root, name, {"start_timestamp": 1.7e9, "host": "box"})
    t0 = 1.7e9
    for start in range(0, STEPS, 500):
        steps, system, layers = [], [], []
        for step in range(start + 1, start + 501):
            row: dict[str, object] = {
                "step": float(step),
                "time": t0 + step * 0.1,
                "loss": math.nan if step == 50 else 1.0 / step + 0.123456789,
                "lr": 1e-3 * (1 - step / STEPS),
                "step_time": 0.1 + (step % 7) * 1e-3,
                "samples": 32.0,
            }
            if step % 10 == 0:
                row["accuracy"] = step / STEPS
            steps.append(row)
            if step % 5 == 0:  # two samples stamped with the same step
                for k in range(2):
                    system.append(
                        {
                            "time": t0 + step * 0.1 + k * 0.01,
                            "step": float(step),
                            "cpu_percent": 50.0 + k,
                            "gpu0_power_w": 200.0 + step % 13,
                            "gpu0_energy_j": step * 20.0 + k,
                        }
                    )
            if step % 50 == 0:
                layers.append({"step": float(step), "grad_norm/fc.weight": 0.5 + step * 1e-4})
        events = [{"rule": "loss_spike", "severity": "warning", "message": "m", "step": start}]
        log.write(Batch({"steps": steps, "system": system, "layers": layers, "events": events}))
        log.flush()
    log.close({"status": "closed", "steps": STEPS})
    if not close:  # as a writer that has not closed yet leaves it: no end, no status
        meta = json.loads((log.path / "meta.json").read_text())
        for key in ("end_time", "status", "steps", "errors"):
            meta.pop(key, None)
        (log.path / "meta.json").write_text(json.dumps(meta))
    return log.path


def assert_same(exported: Exported, path: pathlib.Path, float32: bool = False) -> None:
    """``exported`` (tag -> (step, value) in the order written) holds exactly the run's keys,
    each at the run's steps with the run's values (float32 where the tool keeps float32)."""
    run = nbmonitor.open(path)
    expected_tags = set()
    for stream, prefix in PREFIX.items():
        cols = run.columns(stream)
        if not cols:
            continue
        steps = cols["step"].astype(np.int64)
        for key, col in cols.items():
            if key in ("step", "time"):
                continue
            tag = f"{prefix}/{key}"
            expected_tags.add(tag)
            # Each exported point, in order, on the next row with its step (steps repeat: two
            # system samples, a layer row of norms and one of ratios, may share a step).
            values = np.full(len(steps), math.nan)
            row = 0
            for s, v in exported[tag]:
                while row < len(steps) and not (
                    steps[row] == s and math.isnan(col[row]) == math.isnan(v)
                ):
                    row += 1
                assert row < len(steps), f"{tag}: step {s} not in the run (or out of order)"
                values[row] = v
                row += 1
            want = col.astype(np.float32).astype(np.float64) if float32 else col
            np.testing.assert_array_equal(values, want, err_msg=tag)
    assert set(exported) == expected_tags


def wandb_teardown() -> None:
    """Forget W&B's process-wide state (its settings singleton, its service): the next test
    starts from the environment it sets."""
    import wandb

    wandb.teardown()
