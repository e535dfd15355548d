"""Where the gradient norms' host time goes on the way to the host, part by part, against
``_foreach_norm`` alone: the calls the CUDA path makes, timed here on the CPU (each a dispatch
through torch, which is what a launch-bound step pays; the CPU kernels themselves differ).

    python benchmarks/norm_path.py                 # mlp20's 42 gradients
    python benchmarks/norm_path.py --task mlp50

Parts, each the median of ``--reps`` timings in the thread's CPU time (microseconds):

- ``grads``: the list of the gradients (one ``p.grad`` each);
- ``foreach_norm`` / ``foreach_norm dtype``: the fused norm, without and with its ``dtype``;
- ``stack``: the norms as one tensor; ``detach``: the detach the old path made of it;
- ``to new tensor``: a copy into a tensor made for it (the old path's ``.to("cpu",
  non_blocking=True)`` made a pinned one each step); ``copy into a ring row``: into a row made
  once (``PinnedRing``);
- ``old path`` / ``new path``: the norms and the loss as the CUDA path crossed them before
  (stack, detach, a new host tensor, and the loss's own detach and new tensor: two copies)
  and now (one stack of the norms and the loss, one copy into a ring row). CUDA's events are
  not timed here (the old path made a new one per value and five per step for the phases; the
  new one records one per step, made once).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import _foreach_norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import make_task


def _timed(work: Callable[[], object], reps: int) -> float:
    clock = time.thread_time_ns
    times = []
    for _ in range(reps):
        t = clock()
        work()
        times.append(clock() - t)
    return statistics.median(times) / 1000.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="mlp20")
    ap.add_argument("--reps", type=int, default=3000)
    args = ap.parse_args()
    model, loss_fn = make_task(args.task)
    loss = loss_fn(model)
    loss.backward()
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    norms = _foreach_norm(grads, 2, dtype=torch.float32)
    stacked = torch.stack(norms)
    ring = torch.empty((4, len(grads) + 1))
    row = ring[0]
    with torch.no_grad():
        pair = torch.stack([*norms, loss])

    def old() -> object:
        gs = [p.grad for p in params if p.grad is not None]
        values = torch.stack(_foreach_norm(gs, 2, dtype=torch.float32)).detach()
        host = torch.empty_like(values).copy_(values)
        return host, torch.empty_like(loss).copy_(loss.detach())

    def new() -> object:
        gs = [p.grad for p in params if p.grad is not None]
        values = _foreach_norm(gs, 2, dtype=torch.float32)
        enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        out = torch.stack([*values, loss])
        torch._C._set_grad_enabled(enabled)
        return row.copy_(out)

    parts: dict[str, Callable[[], object]] = {
        "grads": lambda: [p.grad for p in params if p.grad is not None],
        "foreach_norm": lambda: _foreach_norm(grads, 2),
        "foreach_norm dtype": lambda: _foreach_norm(grads, 2, dtype=torch.float32),
        "stack": lambda: torch.stack(norms),
        "detach": stacked.detach,
        "to new tensor": lambda: torch.empty_like(stacked).copy_(stacked),
        "copy into a ring row": lambda: row.copy_(pair),
        "old path": old,
        "new path": new,
    }
    print(f"{args.task}: {len(grads)} gradients, thread CPU us (median of {args.reps})")
    for rnd in range(2):  # interleaved twice: the second pass is the one to read
        results = {name: _timed(work, args.reps) for name, work in parts.items()}
        print(f"pass {rnd + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
