"""What steering costs a step (issue 40): nothing while unused, and what a request held for a
later step (``at_step``, as a torchrun job's requests are) costs at each step boundary.

Unused, the step clock has no steering listener: ``StepClock._end_step`` reads
``self.step_listeners`` (an empty list) as it did before steering existed, so the cost is one
attribute read, counted here rather than timed (``listeners``). With a request held for a step
far ahead the listener runs at each step's end and finds nothing due: timed directly
(``at_boundary_us``, the call alone) and as the step time of a tiny loop, blocks of steps
alternated between the two states so that a drifting machine shifts both alike.

    python benchmarks/steer_cost.py                  # 30 blocks of 200 steps
    python benchmarks/steer_cost.py --blocks 60 --steps 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import timeit

import torch

import nbmonitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    with tempfile.TemporaryDirectory() as tmp:
        mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False)
        clock = mon._life.clock()
        assert clock is not None
        steering = mon.steering

        def steps(n: int) -> float:
            start = time.perf_counter()
            for _ in range(n):
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            return (time.perf_counter() - start) / n

        steps(200)  # warm
        idle_listeners = len(clock.step_listeners)
        idle: list[float] = []
        held: list[float] = []
        for block in range(args.blocks):
            order = ("idle", "held") if block % 2 == 0 else ("held", "idle")
            for state in order:
                if state == "held":
                    steering.request("checkpoint", at_step=10**12)  # due never
                    held.append(steps(args.steps))
                else:
                    idle.append(steps(args.steps))
                # The held request goes (as at close): the listener leaves with it.
                steering._pending.clear()
                with steering._lock:
                    steering._unlisten()
        steering.request("checkpoint", at_step=10**12)
        n = 200_000
        call = timeit.timeit(lambda: steering.at_boundary(clock.step), number=n) / n
        mon.close()
    out = {
        "listeners_when_unused": idle_listeners,
        "step_us_idle_median": round(statistics.median(idle) * 1e6, 2),
        "step_us_request_held_median": round(statistics.median(held) * 1e6, 2),
        "at_boundary_us": round(call * 1e6, 3),
        "blocks": args.blocks,
        "steps_per_block": args.steps,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
