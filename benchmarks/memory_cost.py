"""What the memory breakdown costs the training thread (benchmarks/NOTES.md, "Memory
breakdown"): ``held()`` (parameters, buffers, gradients and optimizer state read from the
tensors, at the end of each sampled step) and a sampled step's forward + backward with the
saved-tensor hooks in place, against the same step unsampled.

Rounds alternate (unsampled, sampled, held) so that a drifting VM hits them all alike; each
figure is the median over rounds, with the lowest and highest round.

    python benchmarks/memory_cost.py                    # mlp20 and a 4-layer transformer
    python benchmarks/memory_cost.py --rounds 21 --reps 20
    python benchmarks/memory_cost.py --clock wall      # wall time instead of the thread's CPU time
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from nbmonitor._capture.memory_breakdown import held
from nbmonitor._capture.probes.base import StepContext
from nbmonitor._capture.probes.memory import MemoryProbe
from nbmonitor._capture.recorder import Recorder
from nbmonitor.errors import ErrorLog, Guard


def mlp20() -> tuple[torch.nn.Module, torch.Tensor]:
    layers: list[torch.nn.Module] = []
    for _ in range(20):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), torch.randn(32, 256)


def transformer() -> tuple[torch.nn.Module, torch.Tensor]:
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False), torch.randn(
        8, 64, 128
    )


# The training thread's CPU time by default: on a loaded machine the wall time mostly measures
# how long the thread waited for a core (torch runs on this thread with one torch thread).
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
CLOCK = CLOCKS["thread"]


def timed(fn: Callable[[], None], reps: int) -> float:
    start = CLOCK()
    for _ in range(reps):
        fn()
    return (CLOCK() - start) / reps


def measure(name: str, make: Callable[[], tuple[torch.nn.Module, torch.Tensor]], args) -> None:
    torch.manual_seed(0)
    model, x = make()
    opt = torch.optim.Adam(model.parameters())
    model(x).pow(2).mean().backward()
    opt.step()  # the optimizer state exists
    probe = MemoryProbe(Guard("probe:memory", ErrorLog()), model, every=1)
    probe.bind(lambda: opt)
    ctx = StepContext(Recorder())

    def plain() -> None:
        model(x).pow(2).mean().backward()

    def sampled() -> None:
        probe.forward_pre(ctx)
        model(x).pow(2).mean().backward()

    def breakdown() -> None:
        held(model, opt)

    rows: dict[str, list[float]] = {"plain": [], "sampled": [], "held": []}
    for _ in range(args.rounds):
        rows["plain"].append(timed(plain, args.reps))
        rows["sampled"].append(timed(sampled, args.reps))
        rows["held"].append(timed(breakdown, args.reps))
    n_params = sum(1 for _ in model.parameters())
    saved = sum(r.tensors for r in probe._saved.memory_rows()) if probe._saved else 0
    print(f"{name}: {n_params} parameter tensors, {saved} saved-tensor storages per forward")
    extra = [s - p for s, p in zip(rows["sampled"], rows["plain"], strict=True)]
    for label, values in (
        ("step unsampled", rows["plain"]),
        ("step sampled", rows["sampled"]),
        ("sampled - unsampled", extra),
        ("held()", rows["held"]),
    ):
        ms = [v * 1e3 for v in values]
        print(
            f"  {label:22s} median {statistics.median(ms):8.3f} ms  "
            f"(rounds {min(ms):.3f} .. {max(ms):.3f})"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="thread")
    args = ap.parse_args()
    global CLOCK
    CLOCK = CLOCKS[args.clock]
    print(f"clock: {args.clock} ({'this thread CPU time' if args.clock == 'thread' else 'wall'})")
    torch.set_num_threads(1)
    measure("mlp20 (20 x Linear(256, 256), batch 32)", mlp20, args)
    measure("transformer (4 encoder layers, d=128, 8 x 64 tokens)", transformer, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
