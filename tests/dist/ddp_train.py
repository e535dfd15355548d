"""A tiny DDP training run under torchrun (gloo, CPU) with nbmonitor attached: the script the
tests in this folder launch. Arguments: run_dir, steps, the rank that sleeps each step (-1:
none), the sleep in seconds."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import nbmonitor


def main() -> None:
    run_dir, steps, slow_rank, sleep = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=run_dir, interval=0.1, layer_every=0)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        if rank == slow_rank:
            time.sleep(sleep)  # a slow input pipeline on this rank
        x = torch.randn(32, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.log(loss=loss)
    mon.close()
    print(f"done rank {rank} {mon.run_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
