"""Nothing nbmonitor does reaches the user's output as a warning, and a loop stopped by
on_nan="raise" leaves its event in the run log."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import nbmonitor
from nbmonitor.records import NormLayout, squared_norms, squared_norms_split


def mlp() -> torch.nn.Sequential:
    # Notebook 02's: four biases, so that they are read in one cat (grad_norms.cpu_plan).
    layers: list[torch.nn.Module] = []
    for _ in range(3):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(16, 1))


def test_squares_of_huge_norms_are_inf_without_a_warning() -> None:
    huge = np.array([[3e38, 1.0, 2e38, 1.0, 1.0]], dtype=np.float32)
    layout = NormLayout(squared=0, norms=1, starts=(0, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isfinite(squared_norms(huge[:, :1], None)).all()  # float64 squares
        # Biases are squared in their own float32: 2e38 squared overflows to Inf, silently.
        out = squared_norms_split(huge[:, :0], huge, layout)
    assert np.isinf(out[0, 1]) and out[0, 2] == 2.0


def test_a_diverging_run_prints_no_numpy_warning(tmp_path) -> None:
    # Notebook 02's "learning rate that blows up to NaN" passes through gradients that are
    # finite in float32 but whose squares are not (above ~1.8e19). With warnings as errors, a
    # numpy warning on the sampler thread is an exception there, counted in mon.errors.
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-30)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for i in range(30):
            x = torch.randn(32, 16)
            scale = 1e25 if i >= 20 else 1.0  # bias gradients of ~1e25: finite, squares Inf
            loss = model(x).mean() * scale
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
        mon.flush()
    assert mon.errors == []
    assert "grad_non_finite" in {a.rule for a in mon.events()}


def test_on_nan_raise_stop_is_an_event_in_the_run_log(tmp_path) -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, on_nan="raise")
    with pytest.raises(nbmonitor.NonFiniteError), mon:
        for _ in range(60):
            x = torch.randn(32, 16) * 3
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    events = nbmonitor.open(mon.run_dir).events()
    stops = [e for e in events if e["rule"] == "stopped_non_finite"]
    assert len(stops) == 1, events
    assert stops[0]["severity"] == "error" and "on_nan='raise'" in str(stops[0]["message"])
    assert "0.weight" in list(stops[0]["layers"])  # type: ignore[arg-type]


def test_check_forward_raise_stop_names_the_module_in_the_run_log(tmp_path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with (
        pytest.raises(nbmonitor.NonFiniteError),
        nbmonitor.attach(
            model, opt, run_dir=tmp_path, display=False, on_nan="raise", check_forward=True
        ),
    ):
        for i in range(10):
            x = torch.randn(8, 16)
            if i == 5:
                x[0, 3] = float("nan")  # a bad input batch
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    events = nbmonitor.open(tmp_path / next(p.name for p in tmp_path.iterdir())).events()
    stop = next(e for e in events if e["rule"] == "stopped_non_finite")
    assert "layer 0 (Linear)" in str(stop["message"]) and stop["step"] == 6
