"""A tiny DDP training run under torchrun (gloo, CPU) with nbmonitor attached: the script
tests/dist/test_torchrun_ddp.py launches. Arguments: run_dir, steps, the rank that sleeps
before each step (-1: none), the sleep in seconds.

Every collective of ``torch.distributed`` reachable from Python (the module's functions and
the ProcessGroup's methods) is counted from before ``attach`` to after ``close``; DDP's own
all-reduce runs in C++ and is not seen, so the count is nbmonitor's alone. It is printed as
``collectives N``, then one deliberate ``barrier()`` is counted to show the counter works.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import nbmonitor

COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "recv", "isend", "irecv", "monitored_barrier",
)  # fmt: skip
GROUP_METHODS = (
    "allreduce", "allgather", "allgather_coalesced", "alltoall", "alltoall_base", "barrier",
    "broadcast", "gather", "reduce", "reduce_scatter", "scatter", "send", "recv",
)  # fmt: skip
calls: list[str] = []


def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return fn(*args, **kwargs)

    return wrapper


def count_collectives() -> None:
    c10d = dist.distributed_c10d
    for name in COLLECTIVES:
        for module in (dist, c10d):
            if hasattr(module, name):
                setattr(module, name, counted(name, getattr(c10d, name)))
    group = dist.ProcessGroup
    for name in GROUP_METHODS:
        if hasattr(group, name):
            setattr(group, name, counted(f"ProcessGroup.{name}", getattr(group, name)))


def main() -> None:
    run_dir, steps = sys.argv[1], int(sys.argv[2])
    slow_rank, sleep = int(sys.argv[3]), float(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model = DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    count_collectives()
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
    print(f"collectives {len(calls)} {calls}", flush=True)
    dist.barrier()
    print(f"after barrier {len(calls)}", flush=True)
    print(f"run_dir {mon.run_dir}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
