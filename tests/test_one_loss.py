"""One loss per step: a model's ``.loss``, the backward passes' roots and ``mon.log(loss=...)``
in the same step are not averaged; the logged value wins, then the sum of what the step's
backward passes started from, then the output's ``.loss``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tests.helpers import HFStyle

import nbmonitor


def test_the_logged_loss_wins_over_the_models_output(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = HFStyle()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    want = []
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for step in range(4):
            outputs = []
            for _ in range(2):  # accumulation: two outputs' losses in the step
                out = model(input_ids=torch.randn(6, 4), labels=torch.randint(0, 2, (6,)))
                out.loss.backward()
                outputs.append(out.loss.item())
            opt.step()
            opt.zero_grad()
            if step % 2 == 0:
                mon.log(loss=out.loss * 10)  # e.g. the loss scaled back up, as a loop logs it
                want.append(out.loss.item() * 10)
            else:
                # Nothing logged: what the step's backward passes started from, added up.
                want.append(sum(outputs))
        mon.flush()
        h = mon.history()
    np.testing.assert_allclose(h["loss"], want, rtol=1e-6)
