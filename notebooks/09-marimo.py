import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


@app.cell
def _():
    import math
    import os

    import marimo as mo
    import torch
    from torch import nn

    import nbmonitor

    return math, mo, nbmonitor, nn, os, torch


@app.cell
def _(mo):
    mo.md(
        """
        # nbmonitor in marimo

        `nbmonitor.attach` in a marimo notebook: the dashboard is an anywidget, so marimo draws
        it, and it updates while the training cell runs. Show it with `mon.dashboard()` as a
        cell's output.
        """
    )
    return


@app.cell
def _(math, nbmonitor, nn, os, torch):
    torch.manual_seed(0)
    # Tests shorten (or lengthen) the run with NBMONITOR_QUICKSTART_STEPS.
    STEPS = int(os.environ.get("NBMONITOR_QUICKSTART_STEPS", "1500"))
    X = torch.randn(8_192, 32)
    Y = (X[:, :8].sum(1) > 0).long()
    model = nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.1 + 0.45 * (1 + math.cos(math.pi * s / STEPS))
    )
    mon = nbmonitor.attach(model, opt, total_steps=STEPS)
    return STEPS, X, Y, mon, model, opt, sched


@app.cell
def _(mon):
    mon.dashboard()
    return


@app.cell
def _(STEPS, X, Y, mon, model, nn, opt, sched, torch):
    for _step in range(STEPS):
        _idx = torch.randint(0, len(X), (128,))
        _loss = nn.functional.cross_entropy(model(X[_idx]), Y[_idx])
        opt.zero_grad()
        _loss.backward()
        opt.step()
        sched.step()
        mon.log(loss=_loss)
    mon.close()
    return


if __name__ == "__main__":
    app.run()
