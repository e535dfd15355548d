"""Command line: ``python -m nbmonitor demo`` trains a tiny model with the monitor attached."""

from __future__ import annotations

import argparse
import time


def demo(seconds: float, run_dir: str, interval: float) -> int:
    import torch

    import nbmonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 128),
        torch.nn.ReLU(),
        torch.nn.Linear(128, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10_000)
    true_w = torch.randn(32, 1)
    # Steps are estimated from a short warm-up so that total_steps (and the ETA) mean something.
    estimate = max(100, int(seconds * 800))
    with nbmonitor.attach(
        model, optimizer, total_steps=estimate, run_dir=run_dir, name="demo", interval=interval
    ) as mon:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and mon.step < estimate:
            x = torch.randn(64, 32)
            y = x @ true_w + 0.1 * torch.randn(64, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            mon.log(loss=loss)
    history = mon.history()
    print(
        f"nbmonitor demo: {int(history['step'][-1])} steps, final loss "
        f"{history['loss'][-1]:.4f}; run written to {mon.run_dir}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nbmonitor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train a tiny model on synthetic data with the monitor")
    p_demo.add_argument("--seconds", type=float, default=20.0)
    p_demo.add_argument("--run-dir", default="runs")
    p_demo.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    return demo(args.seconds, args.run_dir, args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
