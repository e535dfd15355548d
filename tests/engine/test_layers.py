"""Per-layer debugging through the engine: each training bug built on purpose, exact names."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor._capture.probes.grad_norms import cpu_plan
from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor.live.monitor import Monitor


def attach(
    model: torch.nn.Module, opt: torch.optim.Optimizer | None, tmp_path: Path, **kw: object
) -> Monitor:
    kw.setdefault("display", False)
    kw.setdefault("interval", 60.0)
    return nbmonitor.attach(model, opt, run_dir=tmp_path, **kw)  # type: ignore[arg-type]


def rules(mon: Monitor) -> dict[str, tuple[str, ...]]:
    mon.flush()
    found: dict[str, tuple[str, ...]] = {}
    for a in mon.events():  # a rule may alert again for layers that start to hold later
        found[a.rule] = found.get(a.rule, ()) + tuple(
            n for n in a.layers if n not in found.get(a.rule, ())
        )
    return found


class TwoBranch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = torch.nn.Linear(4, 1)
        self.side = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x) + self.side(x).detach()  # the bug: side never gets a gradient


def test_detached_branch_is_reported_by_name(tmp_path):
    model = TwoBranch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        for _ in range(12):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        found = rules(mon)
    assert found["gradient_not_flowing"] == ("side.weight", "side.bias")
    # Stamped where it became known, 10 steps in, however late the sampler checked it.
    assert [a.step for a in mon.events() if a.rule == "gradient_not_flowing"] == [10]
    mon.flush()
    table = {r["name"]: r for r in mon.layers()}
    assert "gradient_not_flowing" in table["side.weight"]["flags"]
    assert math.isnan(table["side.weight"]["grad_norm"])
    assert table["main.weight"]["flags"] == []


def test_param_missing_from_optimizer_and_frozen_in_optimizer(tmp_path):
    model = mlp(width=4, depth=2)
    model[0].weight.requires_grad_(False)
    params = [p for n, p in model.named_parameters() if n != "4.bias"]
    opt = torch.optim.SGD(params, lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        found = rules(mon)
        mon.flush()
        layers = {r["name"]: r for r in mon.layers()}
    assert found["params_not_in_optimizer"] == ("4.bias",)
    assert found["frozen_params_in_optimizer"] == ("0.weight",)
    assert layers["4.bias"]["in_optimizer"] is False
    assert layers["0.weight"]["requires_grad"] is False


def test_lr_zero_group(tmp_path):
    model = mlp(width=4, depth=1)
    opt = torch.optim.SGD(
        [{"params": model[0].parameters(), "lr": 0.0}, {"params": model[2].parameters()}], lr=0.1
    )
    with attach(model, opt, tmp_path) as mon:
        found = rules(mon)
    assert set(found["lr_zero"]) == {"0.weight", "0.bias"}


def test_nan_gradient_localised_to_the_injected_parameter(tmp_path):
    model = mlp(width=4, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 3, width=4)
        handle = model[2].weight.register_hook(lambda g: g * float("nan"))
        train(model, opt, mon, 1, width=4)
        handle.remove()
        mon.flush()
        alerts = [a for a in mon.events() if a.rule == "grad_non_finite"]
        mon.flush()
        h = mon.history()
    assert len(alerts) == 1
    assert alerts[0].layers == ("2.weight",)
    assert alerts[0].step == 4
    assert "2.weight" in alerts[0].message
    assert math.isnan(h["grad_norm"][3]) and np.all(np.isfinite(h["grad_norm"][:3]))
    events = nbmonitor.open(mon.run_dir).events()
    assert any(e["rule"] == "grad_non_finite" and e["layers"] == ["2.weight"] for e in events)


def test_a_tick_mixing_finite_and_nan_steps_keeps_every_step_in_the_layer_window(tmp_path):
    # One tick brings steps 1-5 as one block whose step 4 is non-finite: the finite steps on
    # either side of it must reach the per-layer window too, each with its own norms. Tanh, not
    # ReLU: the heatmap shows log10 norms, and a layer dead for a whole batch has norm 0.
    t = torch.nn
    model = t.Sequential(t.Linear(4, 4), t.Tanh(), t.Linear(4, 4), t.Tanh(), t.Linear(4, 1))
    opt = FrozenSGD(model.parameters(), lr=0.1)
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 3, width=4)
        handle = model[2].weight.register_hook(lambda g: g * float("nan"))
        train(model, opt, mon, 1, width=4)
        handle.remove()
        train(model, opt, mon, 1, width=4)
        mon.flush()
        layers = mon.frame(detail=True).layers
        assert layers is not None
        steps, norms, names = layers.steps, layers.log10_grad_norm, list(layers.names)
    assert steps.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    row = names.index("2.weight")
    assert math.isnan(norms[row, 3])
    assert np.all(np.isfinite(np.delete(norms[row], 3)))
    assert np.all(np.isfinite(np.delete(norms, row, axis=0)[:, [0, 1, 2, 4]]))


def test_every_reader_sees_the_waiting_norms(tmp_path):
    model = mlp(width=4, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, layer_every=0) as mon:
        train(model, opt, mon, 2, width=4)
        # layers() collects and reads at once.
        mon.flush()
        table = {row["name"]: row for row in mon.layers()}
        assert math.isfinite(table["0.weight"]["grad_norm"])
        train(model, opt, mon, 2, width=4)
        mon.flush()
        frame = mon.frame(detail=True)
        assert frame.layers is not None
        assert frame.layers.steps.tolist() == [1.0, 2.0, 3.0, 4.0]
        train(model, opt, mon, 2, width=4)
        mon.flush()  # unpaced: the health rules run, and read the window first
        frame = mon.frame(detail=True)
        assert frame.layers is not None
        assert frame.layers.steps.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_check_forward_names_the_first_module_with_nan_output(tmp_path):
    model = mlp(width=4, depth=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, check_forward=True) as mon:
        train(model, opt, mon, 2, width=4)
        with torch.no_grad():
            model[4].weight[0, 0] = float("nan")
        train(model, opt, mon, 1, width=4)
        mon.flush()
        alert = next(a for a in mon.events() if a.rule == "grad_non_finite")
    assert "first module with a non-finite output was layer 4 (Linear)" in alert.message


def test_on_nan_raise_stops_before_the_bad_update(tmp_path):
    model = mlp(width=4, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, on_nan="raise") as mon:
        train(model, opt, mon, 2, width=4)
        model[2].bias.register_hook(lambda g: g * float("inf"))
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.randn(2, 4)).sum().backward()
        with pytest.raises(nbmonitor.NonFiniteError, match=r"first in 2\.bias"):
            opt.step()
        for p, b in zip(model.parameters(), before, strict=True):
            assert torch.equal(p, b)


def test_on_nan_raise_with_check_forward_raises_in_forward(tmp_path):
    model = mlp(width=4, depth=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, on_nan="raise", check_forward=True):
        with torch.no_grad():
            model[2].bias[0] = float("nan")
        with pytest.raises(nbmonitor.NonFiniteError, match="first in module '2'"):
            model(torch.randn(2, 4))


def test_update_ratio_matches_sgd_update(tmp_path):
    model = mlp(width=4, depth=1)
    lr = 0.1
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with attach(model, opt, tmp_path, layer_every=2) as mon:
        train(model, opt, mon, 1, width=4)
        x = torch.randn(4, 4)
        model(x).pow(2).mean().backward()
        w = model[0].weight.detach().clone()
        expected = (lr * model[0].weight.grad.norm() / w.norm()).item()
        opt.step()
        opt.zero_grad()
        mon.flush()
        table = {r["name"]: r for r in mon.layers()}
    assert table["0.weight"]["update_ratio"] == pytest.approx(expected, rel=1e-4)
    assert table["0.weight"]["param_norm"] == pytest.approx(w.norm().item(), rel=1e-5)
    layers_log = nbmonitor.open(mon.run_dir).layers()
    measured = ~np.isnan(layers_log["update_ratio/0.weight"])
    # Every one of the first steps is measured (probes/base.due), then every layer_every.
    assert list(layers_log["step"][measured]) == [1.0, 2.0]
    # the per-layer gradient norms the replayed heatmap is drawn from are there too
    assert np.isfinite(layers_log["grad_norm/0.weight"]).any()


def test_layer_every_zero_turns_update_ratio_off(tmp_path):
    model = mlp(width=4, depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, opt, tmp_path, layer_every=0) as mon:
        train(model, opt, mon, 4, width=4)
        mon.flush()
        rows = mon.layers()
    assert all(math.isnan(r["update_ratio"]) for r in rows)
    assert all(math.isfinite(r["grad_norm"]) for r in rows)


def test_group_by_module(tmp_path):
    model = mlp(width=4, depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with attach(model, opt, tmp_path, layer_group="module") as mon:
        model(torch.randn(2, 4)).sum().backward()
        expected = torch.cat([model[0].weight.grad.reshape(-1), model[0].bias.grad]).norm()
        opt.step()
        mon.flush()
        table = mon.layers(as_dataframe=True)
    assert list(table["name"]) == ["0", "2"]
    assert table.loc[0, "grad_norm"] == pytest.approx(expected.item(), rel=1e-5)
    assert table.loc[0, "numel"] == 4 * 4 + 4


def test_layer_table_fields(tmp_path):
    model = mlp(width=4, depth=1)
    opt = torch.optim.Adam(model.parameters())
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 2, width=4)
        mon.flush()
        row = mon.layers()[0]
    assert set(row) == {
        "name",
        "shape",
        "numel",
        "dtype",
        "device",
        "requires_grad",
        "in_optimizer",
        "grad_norm",
        "param_norm",
        "update_ratio",
        "flags",
    }
    assert row["name"] == "0.weight" and row["shape"] == (4, 4) and row["numel"] == 16
    assert row["dtype"] == "float32" and row["device"] == "cpu" and row["in_optimizer"] is True


def test_vanishing_gradients_in_deep_sigmoid_net(tmp_path):
    torch.manual_seed(0)
    model = mlp(width=16, depth=24, activation=torch.nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path) as mon:
        train(model, opt, mon, 40, width=16)
        mon.flush()
        found = rules(mon)
    assert "vanishing_gradients" in found
    assert "0.weight" in found["vanishing_gradients"]
    assert "48.weight" not in found["vanishing_gradients"]  # the last layer still learns


def test_dead_relu_units_are_named(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every pre-activation negative: the ReLU outputs zeros
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, activations=True, layer_every=1) as mon:
        train(model, opt, mon, 25, width=4)
        mon.flush()
        found = rules(mon)
    assert found["dead_units"] == ("1",)


def test_healthy_training_raises_no_alert(tmp_path):
    torch.manual_seed(0)
    model = mlp(width=16, depth=3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = torch.randn(16, 1)
    with attach(model, opt, tmp_path, activations=True) as mon:
        for i in range(300):
            x = torch.randn(32, 16)
            loss = torch.nn.functional.mse_loss(model(x), x @ w)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
            if i % 25 == 0:
                mon.flush()
        mon.flush()
        events = mon.events()
    assert events == [], [a.message for a in events]


def test_heatmap_stays_bounded_and_keeps_spikes():
    params = [ParamInfo(f"p{i}", (2,), 2, "float32", "cpu", True, True) for i in range(3)]
    stats = LayerStats(params, recent=64, columns=16)
    for step in range(1, 1001):
        norms = np.array([1.0, 1.0, 1e6 if step == 537 else 1.0])
        stats.add_grad_norms(step, norms, None)
    _, heat = stats.heatmap()
    assert heat.shape[0] == 3 and heat.shape[1] <= 16
    assert np.nanmax(heat[2]) == pytest.approx(6.0)
    assert np.nanmax(heat[0]) == pytest.approx(0.0)
    recent_steps, recent = stats.recent()
    assert recent.shape == (3, 64) and recent_steps[-1] == 1000


def test_rows_taken_at_once_match_rows_taken_one_by_one():
    # The sampler takes a tick's steps in one pass; the result must not depend on it.
    params = [
        ParamInfo(name, (2,), 2, "float32", "cpu", True, True)
        for name in ("a.weight", "a.bias", "b.weight", "c.weight")
    ]
    rng = np.random.default_rng(0)
    norms = rng.lognormal(size=(300, 3))
    norms[40:45, 1] = np.nan  # b.weight without a gradient for a while
    one, many = (LayerStats(params, group_by="module", recent=64, columns=8) for _ in range(2))
    index = (0, 2, 3)
    for step, row in enumerate(norms, start=1):
        one.add_grad_norms(step, row, index)
    for start in range(0, 300, 37):
        chunk = norms[start : start + 37]
        many.add_grad_norm_rows(list(range(start + 1, start + 1 + len(chunk))), chunk, index)
    for a, b in zip(one.recent() + one.heatmap(), many.recent() + many.heatmap(), strict=True):
        np.testing.assert_allclose(a, b)
    np.testing.assert_allclose(one.latest_grad, many.latest_grad)
    np.testing.assert_array_equal(one.seen, many.seen)
    assert many.seen.tolist() == [True, False, True, True]
    assert many.names == ("a", "b", "c") and np.isfinite(many.latest_grad).all()


@pytest.mark.parametrize("steps", [5, 64, 100, 128, 1001])
def test_recent_window_is_oldest_first_and_aligned(steps):
    params = [ParamInfo(f"p{i}", (2,), 2, "float32", "cpu", True, True) for i in range(2)]
    stats = LayerStats(params, recent=64, columns=16)
    for step in range(1, steps + 1):
        stats.add_grad_norms(step, np.array([float(step), 2.0 * step]), None)
    recent_steps, recent = stats.recent()
    expected = np.arange(max(1, steps - 63), steps + 1, dtype=np.float64)
    np.testing.assert_array_equal(recent_steps, expected)
    np.testing.assert_array_equal(recent, np.stack([expected, 2 * expected]))


@pytest.mark.parametrize("steps", [0, 5, 64, 100, 1001])
def test_peak_since_reads_the_recent_window_as_recent_does(steps):
    """The run log's per-layer row (the largest norm of each layer since the last row) read
    from the ring in place equals the same reduction over ``recent()``'s copy."""
    rng = np.random.default_rng(steps)
    params = [ParamInfo(f"p{i}", (2,), 2, "float32", "cpu", True, True) for i in range(3)]
    stats = LayerStats(params, recent=64, columns=16)
    for step in range(1, steps + 1):
        norms = rng.random(3)
        norms[rng.integers(3)] = math.nan if step % 7 == 0 else norms[0]
        stats.add_grad_norms(step, norms, None)
    recent_steps, recent = stats.recent()
    for after in (-math.inf, 0, steps - 70, steps - 10, steps - 1, steps):
        got = stats.peak_since(after)
        new = recent_steps > after
        if not new.any():
            assert got is None
            continue
        assert got is not None
        assert got[0] == recent_steps[new][-1]
        np.testing.assert_array_equal(got[1], np.fmax.reduce(recent[:, new], axis=1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer_every": -1}, "layer_every must be an int >= 0"),
        ({"layer_group": "block"}, "layer_group must be 'param' or 'module'"),
        ({"on_nan": "ignore"}, "on_nan must be 'warn' or 'raise'"),
        ({"thresholds": {"explode_factr": 3}}, "unknown threshold"),
    ],
)
def test_bad_layer_options(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        attach(mlp(), None, tmp_path, **kwargs)


def test_thresholds_are_configurable(tmp_path):
    model = mlp(width=4, depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with attach(model, opt, tmp_path, thresholds={"explode_abs": 1e-9}) as mon:
        train(model, opt, mon, 30, width=4)
        mon.flush()
        assert "exploding_gradients" in rules(mon)


def test_cpu_dot_path_gives_the_same_norms_in_parameter_order(tmp_path):
    # 0.weight has 65,536 values: its norm goes through the dot-product path, the rest through
    # _foreach_norm; the per-layer table must still line up with the parameters.
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    plan = cpu_plan(list(model.parameters()))
    assert plan is not None and plan.order == (0, 1, 2, 3)
    with attach(model, opt, tmp_path) as mon:
        model(torch.randn(8, 256)).pow(2).mean().backward()
        expected = {n: p.grad.norm().item() for n, p in model.named_parameters()}
        total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        opt.step()
        mon.flush()
        h = mon.history()
        mon.flush()
        rows = {r["name"]: r["grad_norm"] for r in mon.layers()}
    assert h["grad_norm"][0] == pytest.approx(total.item(), rel=1e-5)
    for name, value in expected.items():
        assert rows[name] == pytest.approx(value, rel=1e-5), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_layer_norm_and_the_total_are_exact_on_the_cpu(tmp_path, dtype):
    # Large weights by dot product, biases and LayerNorm parameters by one cat, the rest by
    # _foreach_norm; float64 models too (torch refuses a float32 norm of a float64 tensor).
    # The per-layer table must line up with the parameters whatever the order they were read.
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 3)
    ).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    plan = cpu_plan(list(model.parameters()))
    assert plan is not None and plan.dots == (
        (0, 4) if dtype == torch.float32 else (0, 1, 2, 3, 4, 5)
    )
    assert plan.concat == ((1, 2, 3, 5) if dtype == torch.float32 else ())
    with attach(model, opt, tmp_path) as mon:
        model(torch.randn(8, 256, dtype=dtype)).pow(2).mean().backward()
        grads = {n: p.grad.double() for n, p in model.named_parameters()}
        opt.step()
        mon.flush()
        h = mon.history()
        mon.flush()
        rows = {r["name"]: r["grad_norm"] for r in mon.layers()}
        assert not mon.errors
    total = math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))
    assert h["grad_norm"][0] == pytest.approx(total, rel=1e-5)
    for name, g in grads.items():
        assert rows[name] == pytest.approx(float(g.norm()), rel=1e-5), name


def test_nan_in_a_large_layer_is_named_on_the_dot_path(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    assert cpu_plan(list(model.parameters())) is not None  # the dot-product path
    with attach(model, opt, tmp_path, on_nan="raise"):
        model[2].weight.register_hook(lambda g: g * float("nan"))
        model(torch.randn(8, 256)).sum().backward()
        with pytest.raises(nbmonitor.NonFiniteError, match=r"first in 2\.weight;"):
            opt.step()


def test_update_ratio_skipped_for_too_large_a_copy_is_said_once(tmp_path, monkeypatch):
    monkeypatch.setattr("nbmonitor._capture.probes.update_ratio.UPDATE_COPY_MAX_BYTES", 0)
    model = mlp(width=4, depth=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, opt, tmp_path, layer_every=1) as mon:
        train(model, opt, mon, 3, width=4)
        mon.flush()
        mon.flush()
        skipped = [a for a in mon.events() if a.rule == "update_ratio_skipped"]
        rows = mon.layers()
    assert len(skipped) == 1 and skipped[0].severity == "info"
    assert "Update ratios are not measured" in skipped[0].message
    assert all(math.isnan(r["update_ratio"]) for r in rows)


def test_frozen_tensors_are_not_copied_for_update_ratios(tmp_path, monkeypatch):
    # A fine-tune's base held by AdamW(model.parameters()) but frozen: only the trainable
    # tensors are copied (the cap counts only them), the frozen ones are not measured (NaN).
    model = mlp(width=16, depth=1)
    for p in model[0].parameters():
        p.requires_grad_(False)
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    monkeypatch.setattr("nbmonitor._capture.probes.update_ratio.UPDATE_COPY_MAX_BYTES", trainable)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with attach(model, opt, tmp_path, layer_every=1) as mon:
        train(model, opt, mon, 3, width=16)
        mon.flush()
        mon.flush()
        skipped = [a for a in mon.events() if a.rule == "update_ratio_skipped"]
        rows = {r["name"]: r for r in mon.layers()}
    assert skipped == []
    assert math.isnan(rows["0.weight"]["update_ratio"]) and math.isnan(
        rows["0.bias"]["update_ratio"]
    )
    assert rows["0.weight"]["param_norm"] > 0  # its norm is still read
    assert 0 < rows["2.weight"]["update_ratio"] < 1 and rows["2.bias"]["update_ratio"] > 0


class FrozenSGD(torch.optim.SGD):
    """Steps (so the hooks run) without touching the weights, even with NaN gradients."""

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        return None


def test_second_nan_episode_names_its_own_first_module(tmp_path):
    model = mlp(width=4, depth=3)
    opt = FrozenSGD(model.parameters(), lr=0.1)  # weights change only by hand
    with attach(model, opt, tmp_path, check_forward=True) as mon:
        train(model, opt, mon, 2, width=4)
        with torch.no_grad():
            saved = model[4].weight[0, 0].item()
            model[4].weight[0, 0] = float("nan")
        train(model, opt, mon, 2, width=4)
        with torch.no_grad():
            model[4].weight[0, 0] = saved
        train(model, opt, mon, 3, width=4)  # finite again: the episode is over
        with torch.no_grad():
            model[2].weight[0, 0] = float("nan")
        train(model, opt, mon, 1, width=4)
        mon.flush()
        reports = [a for a in mon.events() if a.rule == "grad_non_finite"]
    assert [a.step for a in reports] == [3, 8]
    assert "non-finite output was layer 4 (Linear)" in reports[0].message
    assert "non-finite output was layer 2 (Linear)" in reports[1].message
