"""A model whose dtype or parameters change mid-run keeps being measured, or says clearly
what it no longer measures."""

from __future__ import annotations

import math

import torch
from tests.helpers import mlp

import nbmonitor


def _steps(model, opt, mon, n, dtype=torch.float32):  # type: ignore[no-untyped-def]
    norms = []
    for _ in range(n):
        loss = model(torch.randn(4, 8, dtype=dtype)).pow(2).mean()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
        opt.step()
        opt.zero_grad()
        mon.log(loss=loss)
    return norms


def test_model_converted_to_double_mid_run_keeps_being_measured(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(
        model, opt, run_dir=tmp_path, display=False, interval=60, layer_every=1
    ) as mon:
        expected = _steps(model, opt, mon, 3)
        model.double()
        expected += _steps(model, opt, mon, 3, torch.float64)
        model.float()
        expected += _steps(model, opt, mon, 2)
        mon.flush()
        assert mon.errors == []
        h = mon.history()
        assert h["step"].tolist() == [float(i) for i in range(1, 9)]
        for got, want in zip(h["grad_norm"], expected, strict=True):
            assert math.isclose(got, want, rel_tol=1e-4)
        layers = {row["name"]: row for row in mon.layers()}
        assert math.isfinite(layers["0.weight"]["grad_norm"])
        assert math.isfinite(layers["0.weight"]["update_ratio"])


def test_a_param_group_added_mid_run_is_named_and_its_learning_rate_recorded(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    head = torch.nn.Linear(8, 8)  # not part of the attached model
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        _steps(model, opt, mon, 2)
        opt.add_param_group({"params": head.parameters(), "lr": 0.5})
        _steps(model, opt, mon, 2)
        mon.flush()
        assert mon.errors == []
        h = mon.history()
        assert h["lr_group1"][-1] == 0.5
        notes = [e for e in mon.events() if e.rule == "param_group_added"]
        assert len(notes) == 1
        assert notes[0].step == 3
        assert "Param group 1" in notes[0].message
        assert "2 of its 2 parameters are not in the attached model" in notes[0].message
    run = nbmonitor.open(mon.run_dir)
    assert [e["rule"] for e in run.events()].count("param_group_added") == 1
