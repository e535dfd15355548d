"""Step-time overhead of nbmonitor on a CPU training loop, measured A/B/A/B interleaved.

Two models: a 20-layer MLP and a small GPT-style transformer. Each round runs a block of steps
per mode, in alternating order; the overhead of a mode is the median over rounds of (mode block /
baseline block of the same round), for two block statistics: the median step time (the issue's
"median step-time ratio", blind to the few steps a sampler tick lands on) and the mean step time
(end to end: it includes them, so blocks should span a few sampler intervals).

    python benchmarks/overhead.py                 # defaults: both models, baseline vs attach
    python benchmarks/overhead.py --rounds 12 --steps 60 --modes baseline attach naive_item
    python benchmarks/overhead.py --tasks tiny --steps 400   # bookkeeping alone, in us

Modes: baseline (no monitor), attach (defaults), attach_dashboard (defaults with the notebook
dashboard as the view), attach_layer_every_1 (parameter norms and update
ratios every step), attach_no_layers (layer_every=0), naive_item (a per-parameter hook that calls
.item() on each gradient norm, for comparison), norm_only (the plain loop and the gradient norms
as nbmonitor takes them, nothing else: the floor of a monitor that keeps per-layer gradient
norms every step), and ``attach+PART+...`` with parts that take one cost out each
(``attach_options``): a short run's overhead decomposed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import nbmonitor
from nbmonitor._capture.probes import base
from nbmonitor._capture.probes.grad_norms import NormPass

BOOTSTRAP_RESAMPLES = 4000
# The block statistics compared: wall (the median and the mean step), CPU a step (thread, process).
STATS = ("median", "mean", "thread_cpu", "process_cpu")


def mlp20(width: int = 256, depth: int = 20) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList(Block(d, 4) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.ln(x))
        return out


def make_task(
    name: str, device: str = "cpu"
) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    torch.manual_seed(0)
    dev = torch.device(device)
    if name.startswith("mlp20"):
        # "mlp20" trains with batch 256; "mlp20_b64" is the small-batch worst case, where the
        # gradient-norm pass is a larger share of a shorter step.
        batch = 64 if name == "mlp20_b64" else 256
        model = mlp20().to(dev)
        x = torch.randn(batch, 256, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    if name == "mlp50":
        # Issue 29's "50-layer model": 50 narrow layers (101 parameters) and short steps, so
        # that a sampler tick carries many steps of many layers each.
        model = mlp20(width=64, depth=50).to(dev)
        x = torch.randn(32, 64, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    if name == "tiny":
        # Almost no compute: the difference in step time is nbmonitor's bookkeeping alone.
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        model = model.to(dev)
        x = torch.randn(4, 8, device=dev)
        return model, lambda m: m(x).pow(2).mean()
    model = TinyGPT().to(dev)
    idx = torch.randint(0, 512, (16, 64), device=dev)
    return model, lambda m: torch.nn.functional.cross_entropy(
        m(idx[:, :-1]).reshape(-1, 512), idx[:, 1:].reshape(-1)
    )


def train_step(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module], torch.Tensor],
    opt: torch.optim.Optimizer,
    mon: Any,
    clip: float | None = None,
) -> None:
    """One step of the loop every benchmark times, logging the loss when ``mon`` is a monitor;
    with ``clip``, the gradients are clipped to that norm first (``clip_grad_norm_``)."""
    loss = loss_fn(model)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if mon is not None:
        mon.log(loss=loss)


class NaiveItemHooks:
    """What hand-written monitors often do: a per-parameter hook calling .item() on its norm."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.norms: dict[str, float] = {}
        self.handles = [
            p.register_post_accumulate_grad_hook(self._hook(name))
            for name, p in model.named_parameters()
        ]

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            assert p.grad is not None
            self.norms[name] = p.grad.norm().item()

        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def attach_options(mode: str) -> dict[str, Any]:
    """The attach options of a mode: a name, or ``attach`` and ``+``-joined parts that take
    one cost out each (``attach+no_layers+slow_sampler``): ``no_layers`` (layer_every=0: no
    update ratios), ``slow_sampler`` (interval=3600: no sampler tick until close), ``no_flops``
    (no FLOPs count in the first forward), ``no_early`` (no extra sampling of the first 100
    steps: layers and memory every ``layer_every`` only)."""
    kwargs: dict[str, Any] = {}
    parts = set(mode.split("+")[1:])
    if mode == "attach_layer_every_1":
        kwargs["layer_every"] = 1
    if mode == "attach_no_layers" or "no_layers" in parts:
        kwargs["layer_every"] = 0
    if mode == "attach_slow_sampler" or "slow_sampler" in parts:
        kwargs["interval"] = 3600.0
    if "no_flops" in parts:
        kwargs["flops"] = False
    return kwargs


def _early_off() -> Callable[[], None]:
    """Turns the first steps' extra sampling off (``probes.base``'s schedule read at each
    call); returns what turns it back on."""
    saved = (base.EARLY_EVERY_STEP, base.EARLY_STEPS)
    base.EARLY_EVERY_STEP = base.EARLY_STEPS = 0

    def restore() -> None:
        base.EARLY_EVERY_STEP, base.EARLY_STEPS = saved

    return restore


def run_block(
    task: str,
    mode: str,
    model: torch.nn.Module,
    loss_fn: Any,
    opt: Any,
    steps: int,
    tmp: str,
    warmup: int = 5,
) -> dict[str, float]:
    """One block of ``steps`` timed steps after ``warmup`` untimed ones: their median and their
    mean (which includes the steps that a sampler tick slowed down). A monitor samples layers
    and memory more often in the first 100 steps (``probes.base.due``): ``warmup=110`` times
    the steady state alone."""
    mon = None
    naive = None
    norms = None
    early = None
    if mode.startswith("attach"):
        kwargs = attach_options(mode)
        if "+no_early" in mode:
            early = _early_off()
        mon = nbmonitor.attach(model, opt, run_dir=tmp, display=False, **kwargs)
        if mode == "attach_dashboard":
            # What a notebook runs at defaults: the widget dashboard instead of the console
            # line (no front-end here, but frames are built and widget state serialised).
            mon.dashboard()
    elif mode == "naive_item":
        naive = NaiveItemHooks(model)
    elif mode == "norm_only":
        norms = NormPass(list(model.parameters()))
    cuda = next(model.parameters()).is_cuda
    times = []
    cpu = time.thread_time(), time.process_time()
    for i in range(steps + warmup):
        if i == warmup:
            cpu = time.thread_time(), time.process_time()
        if i == warmup and cuda:
            torch.cuda.synchronize()
            start = time.perf_counter()
        t0 = time.perf_counter()
        if norms is None:
            train_step(model, loss_fn, opt, mon)
        else:  # the plain step and the gradient norms nbmonitor takes, nothing else
            loss_fn(model).backward()
            norms.take()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if i >= warmup:  # the first steps of a block warm caches and allocators
            times.append(time.perf_counter() - t0)
    thread_cpu, process_cpu = time.thread_time() - cpu[0], time.process_time() - cpu[1]
    if cuda:
        # On a GPU the host runs ahead of the device: time the whole block, synchronised.
        torch.cuda.synchronize()
        times = [(time.perf_counter() - start) / steps]
    if mon is not None:
        mon.close()
    if naive is not None:
        naive.close()
    if early is not None:
        early()
    return {
        "median": statistics.median(times),
        "mean": statistics.fmean(times),
        # CPU a timed step (the training thread's; the process's, its other threads' too),
        # which a loaded machine moves less than wall times. With one torch thread
        # (OMP_NUM_THREADS=1) the training thread's is all of the loop's own work.
        "thread_cpu": thread_cpu / steps,
        "process_cpu": process_cpu / steps,
    }


def environment() -> dict[str, Any]:
    """Where and when a result was measured."""
    return {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def median_ci(
    statistic: Callable[[np.ndarray], np.ndarray], n: int, level: float = 0.95
) -> tuple[float, float]:
    """A percentile-bootstrap confidence interval of ``statistic`` over ``n`` paired items.

    ``statistic`` maps an array of index rows (resamples x n) to one value per row. On this
    VM the run-to-run spread of an overhead is as large as the overhead itself, so a figure
    is only read against a target through its interval (seeded: the same data, the same
    interval).
    """
    rows = np.random.default_rng(0).integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))
    values = statistic(rows)
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def compare(base: list[float], other: list[float]) -> dict[str, Any]:
    """Per-round ratios of ``other`` to the baseline block of the same round, summarised."""
    ratios = [b / a for a, b in zip(base, other, strict=True)]
    diffs = [b - a for a, b in zip(base, other, strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (1.0, 1.0, 1.0)
    r = np.asarray(ratios)
    lo, hi = median_ci(lambda rows: np.median(r[rows], axis=1), len(r))
    return {
        "step_ms": statistics.median(other) * 1e3,
        "added_us": statistics.median(diffs) * 1e6,
        "ratio": statistics.median(ratios),
        "ratio_iqr": [q1, q3],
        "overhead_percent": (statistics.median(ratios) - 1) * 100,
        "overhead_percent_ci95": [(lo - 1) * 100, (hi - 1) * 100],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["mlp20", "mlp20_b64", "gpt"])
    ap.add_argument("--modes", nargs="+", default=["baseline", "attach"])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per block")
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    results: dict[str, Any] = {
        **environment(),
        "rounds": args.rounds,
        "steps_per_block": args.steps,
        "warmup_steps_per_block": args.warmup,
        "device": args.device,
        "tasks": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            model, loss_fn = make_task(task, args.device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            params = sum(p.numel() for p in model.parameters())
            tensors = len(list(model.parameters()))
            blocks: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
            run_block(task, "baseline", model, loss_fn, opt, args.steps, tmp)  # warm-up
            for r in range(args.rounds):
                order = args.modes if r % 2 == 0 else list(reversed(args.modes))
                for mode in order:
                    blocks[mode].append(
                        run_block(task, mode, model, loss_fn, opt, args.steps, tmp, args.warmup)
                    )
                print(f"{task}: round {r + 1} of {args.rounds}", file=sys.stderr, flush=True)
            summary: dict[str, Any] = {"params": params, "param_tensors": tensors}
            for mode in args.modes:
                summary[mode] = {
                    stat: compare(
                        [b[stat] for b in blocks["baseline"]], [b[stat] for b in blocks[mode]]
                    )
                    for stat in STATS
                }
            results["tasks"][task] = summary
            print(f"{task}: {params:,} params in {tensors} tensors", file=sys.stderr)
            for mode in args.modes:
                print(f"  {mode}", file=sys.stderr)
                for stat in STATS:
                    c = summary[mode][stat]
                    lo, hi = c["overhead_percent_ci95"]
                    print(
                        f"    {stat:12s} {c['step_ms']:8.3f} ms {c['overhead_percent']:+6.2f} % "
                        f"(95 % CI {lo:+.2f}..{hi:+.2f})",
                        file=sys.stderr,
                    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
