"""What the health stage costs per check, on a recorded run, checked as the sampler checks it.

    python -m benchmarks.health_cost                     # tiny and mlp20, 20,000 steps each
    python -m benchmarks.health_cost --tasks mlp20 --steps 8000 --every 750 --json out.json
    PYTHONPATH=/path/to/other/checkout python benchmarks/health_cost.py --recording /tmp/rec

A plain torch loop (the ``tiny`` or ``mlp20`` task of ``overhead.py``, AdamW) is recorded
step by step: the columns the rules read (step, time, loss, grad_norm, lr, step_time, the
phases) and the per-layer gradient norms, with update ratios every ``--layer-every`` steps.
Then ``Health`` checks it as the pipeline does, every ``--every`` steps (a sampler tick of a
fast loop brings ~750), each check seeing the steps since the last one judged plus
``HEALTH_WINDOW`` before them; each check's thread CPU time is taken with the steps it judged.
The recording is the same for every variant, so the figures compare code, not runs.

Run from a checkout of the code to measure (``PYTHONPATH=/path/to/checkout``): a checkout
whose ``Health.check`` takes no ``final`` judges each check whole (the code before the grid).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nbmonitor.health import Health, HealthInput
from numpy_calls import NumpyCalls, count_numpy
from overhead import environment, make_task

# What the pipeline gives a check (nbmonitor/_engine/pipeline.py), and its budget.
HEALTH_WINDOW = 512
HEALTH_WINDOW_MAX = 8192
BUDGET_S = 0.001
THIN_BEYOND = (HEALTH_WINDOW_MAX - HEALTH_WINDOW) // 2
PHASES = ("data", "forward", "backward", "other", "optimizer")


def record(task: str, steps: int, layer_every: int) -> dict[str, Any]:
    """``steps`` steps of ``task``, as the rules see them."""
    model, loss_fn = make_task(task)
    torch.set_num_threads(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    cols: dict[str, list[float]] = {k: [] for k in ("step", "time", "loss", "grad_norm", "lr")}
    cols.update({"step_time": [], **{f"phase_{p}_s": [] for p in PHASES}})
    grads: list[list[float]] = []
    update_steps: list[float] = []
    ratios: list[list[float]] = []
    norms: list[list[float]] = []
    last = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        loss = loss_fn(model)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        with torch.no_grad():
            layer = torch.stack([p.grad.norm() for p in params])  # type: ignore[union-attr]
        measure = step % layer_every == 0
        before = [p.detach().clone() for p in params] if measure else []
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if measure:
            with torch.no_grad():
                w = [float(p.norm()) for p in params]
                dw = [float((p - b).norm()) for p, b in zip(params, before, strict=True)]
            update_steps.append(step)
            ratios.append([d / x if x else float("nan") for d, x in zip(dw, w, strict=True)])
            norms.append(w)
        per = layer.tolist()
        grads.append(per)
        row = {
            "step": step,
            "time": time.time(),
            "loss": loss.item(),
            "grad_norm": float(np.sqrt(np.sum(np.square(per)))),
            "lr": 1e-3,
            "step_time": t4 - last,
            "phase_data_s": t0 - last,
            "phase_forward_s": t1 - t0,
            "phase_backward_s": t2 - t1,
            "phase_other_s": t3 - t2,
            "phase_optimizer_s": t4 - t3,
        }
        last = t4
        for key, value in row.items():
            cols[key].append(float(value))
    return {
        "names": tuple(names),
        "steps": {k: np.array(v) for k, v in cols.items()},
        "grads": np.array(grads).T,
        "update_steps": np.array(update_steps, dtype=np.float64),
        "ratios": np.array(ratios).T,
        "norms": np.array(norms).T,
    }


def window(run: dict[str, Any], n: int, rows: int) -> HealthInput:
    """A check after step ``n`` that sees its last ``rows`` steps."""
    keep = slice(max(0, n - rows), n)
    steps = {k: v[keep] for k, v in run["steps"].items()}
    u = int(np.searchsorted(run["update_steps"], n, side="right"))
    lo = max(0, u - 64)  # LayerStats keeps the last UPDATE_HISTORY (64) measured steps
    series, params = run["ratios"][:, lo:u], run["norms"][:, lo:u]
    return HealthInput(
        step=n,
        time=float(steps["time"][-1]),
        steps=steps,
        layer_names=run["names"],
        layer_steps=steps["step"],
        layer_grad_norms=run["grads"][:, keep],
        param_norms=params[:, -1] if u else None,
        update_ratios=series[:, -1] if u else None,
        update_steps=run["update_steps"][lo:u],
        update_series=series,
        param_series=params,
    )


def timed_rules(health: Health) -> dict[str, float]:
    """Wrap each rule's ``check`` and ``Health._settle`` to add their wall time (perf_counter:
    ``thread_time`` costs tens of µs a call on a VM) into the returned mapping, in seconds."""
    spent: dict[str, float] = {}
    for rule in health.rules:
        inner = rule.check

        def check(view: Any, inner: Any = inner, name: str = rule.name) -> Any:
            start = time.perf_counter()
            try:
                return inner(view)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        rule.check = check  # type: ignore[method-assign]
    settle = health._settle

    def settled(outcome: Any, step: int) -> Any:
        start = time.perf_counter()
        try:
            return settle(outcome, step)
        finally:
            spent["(settle)"] = spent.get("(settle)", 0.0) + time.perf_counter() - start

    health._settle = settled  # type: ignore[method-assign]
    return spent


def checked(
    run: dict[str, Any], every: int, budget_s: float, per_rule: bool = False, calls: bool = False
) -> dict[str, Any]:
    """The run checked every ``every`` steps; each check's CPU time and steps judged (with
    ``per_rule``, each rule's wall time per pass, in µs, apart)."""
    health = Health()
    graded = "final" in inspect.signature(health.check).parameters
    passes = 0
    inner = health._check
    by_rule = timed_rules(health) if per_rule else {}
    counter = NumpyCalls()
    if calls:
        count_numpy(health, counter)

    def counted(inp: HealthInput) -> Any:
        nonlocal passes
        passes += 1
        return inner(inp)

    health._check = counted  # type: ignore[method-assign]
    total = run["steps"]["step"].size
    cpu: list[float] = []
    judged: list[int] = []
    alerts: list[tuple[str, int]] = []
    last = 0
    final_ms = 0.0
    for n in [*range(every, total, every), total]:
        final = n == total
        since = int(health.judged_step or 0) if graded else last
        rows = min(HEALTH_WINDOW + n - since, HEALTH_WINDOW_MAX)
        inp = window(run, n, rows)
        start = time.thread_time()
        if graded:
            found = (
                health.check(inp)
                if final
                else health.check(inp, final=False, budget_s=budget_s, thin_beyond=THIN_BEYOND)
            )
        else:
            found = health.check(inp)
        spent = time.thread_time() - start
        now = int(health.judged_step or 0) if graded else n
        if final:  # the close's check: everything left, unbounded
            final_ms = 1e3 * spent
        else:
            cpu.append(spent)
            judged.append(now - (since if graded else last))
        last = n
        alerts += [(a.rule, a.step) for a in found]
    rules = {
        name: round(1e6 * value / max(1, passes), 1)
        for name, value in sorted(by_rule.items(), key=lambda kv: -kv[1])
    }
    return {
        "every": every,
        "checks": len(cpu),
        "passes_us_per_rule": rules,
        "numpy_calls_per_pass": round(sum(counter.counts.values()) / max(1, passes), 1),
        "numpy_calls_per_rule": {
            name: round(n / max(1, passes), 1)
            for name, n in sorted(counter.counts.items(), key=lambda kv: -kv[1])
        },
        "passes": passes,
        "cpu_ms_median": 1e3 * statistics.median(cpu),
        "cpu_ms_p90": 1e3 * float(np.quantile(cpu, 0.9)),
        "cpu_ms_p99": 1e3 * float(np.quantile(cpu, 0.99)),
        "cpu_ms_max": 1e3 * max(cpu),
        "cpu_ms_total": 1e3 * sum(cpu),
        "cpu_ms_final": final_ms,
        "us_per_step_judged": 1e6 * sum(cpu) / max(1, sum(judged)),
        "steps_judged_median": statistics.median(judged),
        "alerts": alerts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["tiny", "mlp20"])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--every", type=int, nargs="+", default=[750, 7500])
    ap.add_argument("--layer-every", type=int, default=10)
    ap.add_argument("--budget-ms", type=float, default=BUDGET_S * 1e3)
    ap.add_argument(
        "--per-rule", action="store_true", help="each rule's wall time per pass (µs), apart"
    )
    ap.add_argument(
        "--calls", action="store_true", help="count each rule's numpy calls per pass (slow)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--recording",
        type=Path,
        help="a folder for the recordings: read from it when there, else recorded and kept "
        "(so that two checkouts are measured on the same runs)",
    )
    args = ap.parse_args()
    out: dict[str, Any] = {"environment": environment(), "load": list(_load()), "runs": []}
    for task in args.tasks:
        run = recorded(task, args.steps, args.layer_every, args.recording)
        for every in args.every:
            got = checked(run, every, args.budget_ms / 1e3, args.per_rule, args.calls)
            got.update(task=task, layers=len(run["names"]), steps=args.steps)
            out["runs"].append(got)
            apart = ("alerts", "passes_us_per_rule", "numpy_calls_per_rule")
            shown = {k: v for k, v in got.items() if k not in apart}
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in shown.items()}), flush=True)  # fmt: skip
            print("  alerts:", got["alerts"][:10], flush=True)
            if args.per_rule:
                rules = got["passes_us_per_rule"]
                print(f"  µs a pass: {sum(rules.values()):.0f};", rules, flush=True)
            if args.calls:
                print("  numpy calls a pass:", got["numpy_calls_per_rule"], flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))


def recorded(task: str, steps: int, layer_every: int, folder: Path | None) -> dict[str, Any]:
    """``record``, or the recording kept in ``folder`` (numpy's own format, no pickle)."""
    if folder is None:
        return record(task, steps, layer_every)
    path = folder / f"{task}-{steps}-{layer_every}.npz"
    if not path.exists():
        run = record(task, steps, layer_every)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {f"steps/{k}": v for k, v in run["steps"].items()}
        arrays.update({k: run[k] for k in ("grads", "update_steps", "ratios", "norms")})
        np.savez(path, names=np.array(run["names"]), **arrays)
    with np.load(path, allow_pickle=False) as data:
        return {
            "names": tuple(str(n) for n in data["names"]),
            "steps": {k.removeprefix("steps/"): data[k] for k in data.files if "/" in k},
            **{k: data[k] for k in ("grads", "update_steps", "ratios", "norms")},
        }


def _load() -> tuple[float, float, float]:
    with open("/proc/loadavg") as f:
        a, b, c = f.read().split()[:3]
    return float(a), float(b), float(c)


if __name__ == "__main__":
    main()
