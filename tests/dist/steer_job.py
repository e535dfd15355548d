"""A two-rank data-parallel job steered while it runs, for tests/dist/test_steer_job.py, which
starts the ranks itself (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the environment).
Arguments: run_dir, ask_at (0: nothing asked from a rank).

Each rank trains until a stop ends its loop (``nbmonitor.StopTraining`` out of
``optimizer.step()``), at most ``MAX_STEPS``. Rank 1 asks its own monitor for a checkpoint at
the end of step ``ask_at``, from its training thread (a rank's ``mon.checkpoint()`` goes to the
whole job); the test stops the job with ``nbmonitor ctl JOB stop``. Each rank prints the step
its loop saw the stop at.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import nbmonitor

MAX_STEPS = 20_000


def main() -> None:
    run_dir, ask_at = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=run_dir, interval=0.1, layer_every=0)
    gen = torch.Generator().manual_seed(rank)
    step = 0
    try:
        while step < MAX_STEPS:
            x = torch.randn(8, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if rank == 1 and ask_at and step == ask_at:
                mon.checkpoint()
            time.sleep(0.01)
    except nbmonitor.StopTraining as exc:
        print(f"loop ended by the stop at {exc.step} after {step}", flush=True)
        dist.destroy_process_group()
        raise
    mon.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
