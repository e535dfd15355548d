"""Gradient rules: exploding (per layer and total), vanishing, the non-finite gradient report."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from tests.health.synthetic import LAYERS, Run, only, rules

from nbmonitor.health import Health, HealthInput, Thresholds, non_finite_gradients


def test_exploding_names_layers_fires_once_and_rearms() -> None:
    health, run = Health(Thresholds(rearm_steps=30)), Run()
    run.add(120)
    assert health.check(run.input()) == []
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    alerts = health.check(run.input())
    alert = only(alerts, "exploding_gradients")
    assert alert.layers == ("fc3.weight", "fc3.bias")
    assert alert.step == 121 and alert.time == 1000.0 + 121
    assert alert.severity == "warning"
    assert "fc3.weight, fc3.bias" in alert.message and "clip_grad_norm_" in alert.message
    assert "\n" not in alert.message
    # Still exploding: no repeat.
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    assert "exploding_gradients" not in rules(health.check(run.input()))
    # Clear for less than rearm_steps, then again: still no repeat.
    run.add(10)
    assert health.check(run.input()) == []
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    assert "exploding_gradients" not in rules(health.check(run.input()))
    # Clear for longer than rearm_steps (checked every few steps), then a new, larger
    # explosion (one that beats the run's maximum): alerts again.
    for _ in range(8):
        run.add(5)
        assert health.check(run.input()) == []
    run.add(3, fc3_weight=500.0)
    again = only(health.check(run.input()), "exploding_gradients")
    assert again.layers == ("fc3.weight",)


def test_exploding_needs_a_sustained_rise_and_history() -> None:
    health, run = Health(), Run()
    run.add(60)
    health.check(run.input())
    run.add(1, fc2_weight=50.0)  # a single bad batch: not an explosion
    run.add(2)
    assert "exploding_gradients" not in rules(health.check(run.input()))
    # Too little history for a running median: nothing is judged.
    short, fresh = Health(), Run()
    fresh.add(10)
    fresh.add(3, fc2_weight=50.0)
    assert short.check(fresh.input()) == []


def test_explode_abs_threshold_is_configurable() -> None:
    run = Run()
    run.add(5)
    run.add(3, fc1_weight=6.0)
    assert Health().check(run.input()) == []  # 6x, and too little history for the median
    alert = only(Health(Thresholds(explode_abs=5.0)).check(run.input()), "exploding_gradients")
    assert alert.layers == ("fc1.weight",)
    assert "above the limit 5" in alert.message


def test_exploding_total_grad_norm_without_layers() -> None:
    run, health = Run(), Health()
    run.add(120)
    inp = run.input()
    grad = inp.steps["grad_norm"].copy()
    grad[-3:] *= 40
    only_total = replace(inp, steps={**inp.steps, "grad_norm": grad}, layer_grad_norms=None)
    alert = only(health.check(only_total), "exploding_gradients")
    assert alert.layers == ()
    assert alert.message.startswith("Total gradient norm exploding")


def test_long_layer_lists_are_cut_in_the_message_but_kept_in_layers() -> None:
    names = tuple(f"block{i}.weight" for i in range(12))
    run, health = Run(names), Health()
    run.add(120)
    health.check(run.input())
    exploding: dict[str, float] = {f"block{i}_weight": 100.0 for i in range(12)}
    run.add(3, **exploding)  # type: ignore[arg-type]
    alert = only(health.check(run.input()), "exploding_gradients")
    assert alert.layers == names
    assert "and 7 more" in alert.message and "block5.weight" not in alert.message


def test_fluctuations_after_convergence_are_not_explosions() -> None:
    # Gradients fall 1000x as the model converges, then jitter 10-20x around the new median:
    # nothing there beats the norms seen while learning, so nothing is exploding.
    health, run = Health(), Run()
    run.add(150)
    run.add(150, fc3_weight=1e-3)
    health.check(run.input())
    run.add(3, fc3_weight=2e-2)
    assert "exploding_gradients" not in rules(health.check(run.input()))


def test_warmup_rise_is_not_an_explosion_but_an_early_one_is() -> None:
    # A learning-rate warm-up lifts the norms 20-fold over 40 steps as the model leaves its
    # initialisation (the quickstart's first layer): no explosion, checked often or once.
    for every in (1, 5, 100):
        health, run = Health(), Run()
        while run.step < 100:
            for _ in range(every):
                i = run.step
                rise = 0.02 * 20 ** min(1.0, max(0.0, (i - 30) / 40))
                noise = run.rng.lognormal(0, 0.2, len(LAYERS))
                run.add(
                    1, **{n.replace(".", "_"): rise * v for n, v in zip(LAYERS, noise, strict=True)}
                )
            assert health.check(run.input()) == [], every
    # A 50x jump shortly after the start (step 31 of a run that arrives in one check) is one.
    early, fresh = Health(), Run()
    fresh.add(30)
    fresh.add(3, fc3_weight=50.0)
    fresh.add(20)
    alert = only(early.check(fresh.input()), "exploding_gradients")
    assert alert.step == 31 and alert.layers == ("fc3.weight",)


def test_a_decayed_norm_that_jumps_is_not_an_explosion() -> None:
    # Norms decay 1000x as the model converges; a 12x jump of the decayed norm is still far
    # below where the run began: noise, not an explosion (the README screenshot's case).
    health, run = Health(), Run()
    run.add(100)
    for i in range(200):
        run.add(1, fc3_weight=10 ** (-3 * min(i, 100) / 100), fc2_weight=1e-3)
    health.check(run.input())
    run.add(3, fc3_weight=1.2e-2, fc2_weight=1.2e-2)
    assert health.check(run.input()) == []


def test_vanishing_after_enough_consecutive_steps() -> None:
    run, health = Run(), Health()
    run.param_norms = np.full(len(LAYERS), 10.0)
    run.add(40)
    run.add(19, fc1_weight=1e-9)
    assert health.check(run.input()) == []
    run.add(1, fc1_weight=1e-9)
    alert = only(health.check(run.input()), "vanishing_gradients")
    assert alert.layers == ("fc1.weight",)
    assert "fc1.weight" in alert.message
    run.add(5, fc1_weight=1e-9)
    assert health.check(run.input()) == []


def test_a_spreading_condition_is_one_episode_within_rearm_steps() -> None:
    # Gradients vanish layer after layer, a new layer every 20 steps while the others stay
    # vanished: one alert, not one per layer, until rearm_steps have passed since it; the
    # layers that joined in between are named in the rule's next alert.
    run, health = Run(), Health(Thresholds(rearm_steps=100))
    run.param_norms = np.full(len(LAYERS), 10.0)
    run.add(40)
    gone: dict[str, float] = {}
    alerts = []
    for name in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias", "fc3_weight", "fc3_bias"):
        gone[name] = 1e-9
        for _ in range(20):
            run.add(1, **gone)
            alerts += [a for a in health.check(run.input()) if a.rule == "vanishing_gradients"]
    # fc1.weight vanishes at step 60 (20 steps in a row); fc1.bias (80) .. fc3.weight (140)
    # join within 100 steps of that alert, silently; fc3.bias (160) joins past the window: one
    # alert names it and those before it.
    assert [(a.step, a.layers) for a in alerts] == [
        (60, ("fc1.weight",)),
        (160, ("fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias")),
    ]
    # Without the fold (rearm_steps 0) every new layer is an alert of its own.
    run, health = Run(), Health(Thresholds(rearm_steps=0))
    run.param_norms = np.full(len(LAYERS), 10.0)
    run.add(40)
    gone.clear()
    count = 0
    for name in ("fc1_weight", "fc1_bias", "fc2_weight"):
        gone[name] = 1e-9
        for _ in range(20):
            run.add(1, **gone)
            count += rules(health.check(run.input())).count("vanishing_gradients")
    assert count == 3


def test_gradients_shrinking_layer_by_layer_through_sigmoids_name_the_stack() -> None:
    # Eight sigmoid layers: each shrinks the gradient 10x on its way back; the first three
    # vanish. The cause is the saturating stack, said with the profile as evidence.
    layers = tuple(f"{i}.weight" for i in range(0, 16, 2))
    run, health = Run(layers), Health()
    run.module_kinds = {str(i): ("Linear" if i % 2 == 0 else "Sigmoid") for i in range(16)}
    run.param_norms = np.ones(len(layers))
    run.add(40, **{f"{2 * i}_weight": 10.0 ** (i - 10) for i in range(8)})
    alert = only(health.check(run.input()), "vanishing_gradients")
    assert alert.is_cause and "Sigmoid" in alert.cause and "ReLU" in alert.fix
    assert alert.layers[:2] == ("0.weight", "2.weight")
    assert 8 < alert.evidence["shrink_per_layer"] < 12


def test_a_bias_cancelled_by_the_norm_after_it_is_not_vanishing() -> None:
    # conv.bias right before a BatchNorm: its gradient is rounding noise (the norm subtracts
    # the batch mean) while conv.weight learns. Zero by construction: nothing to say.
    layers = ("conv.weight", "conv.bias", "bn.weight", "bn.bias", "head.weight", "head.bias")
    run, health = Run(layers), Health()
    run.module_kinds = {"conv": "Conv2d", "bn": "BatchNorm2d", "head": "Linear"}
    run.param_norms = np.full(len(layers), 10.0)
    run.add(200, conv_bias=1e-10)
    assert health.check(run.input()) == []
    # The same bias with its weight vanishing too: the module's gradients vanish.
    run.add(40, conv_bias=1e-10, conv_weight=1e-10)
    alert = only(health.check(run.input()), "vanishing_gradients")
    assert alert.layers == ("conv.weight", "conv.bias")


def test_vanishing_ignores_unknown_param_norms() -> None:
    run, health = Run(), Health()
    run.param_norms = np.full(len(LAYERS), np.nan)
    run.add(40, fc1_weight=1e-12)
    assert health.check(run.input()) == []


def test_non_finite_gradient_report_names_parameters_and_module() -> None:
    names = [f"block{i}.weight" for i in range(8)]
    plain = non_finite_gradients(12, 5.0, names)
    assert (plain.rule, plain.severity, plain.step, plain.time) == (
        "grad_non_finite",
        "error",
        12,
        5.0,
    )
    assert plain.layers == tuple(names)
    assert (
        "first in block0.weight, block1.weight" in plain.message and "and 3 more" in plain.message
    )
    assert "check_forward=True" in plain.message
    forward = non_finite_gradients(12, 5.0, names[:1], (11, "encoder.2", (0.5, 2.0, 1e30)))
    assert "non-finite output was encoder.2 at step 11" in forward.message
    assert "max |x| 1e+30" in forward.message
    checked = non_finite_gradients(12, 5.0, names[:1], None, forward_checked=True)
    assert "Every module's forward output was finite" in checked.message


def test_a_one_step_spike_is_named_at_its_step_with_the_layer_it_came_from() -> None:
    health, run = Health(), Run()
    run.add(80)
    assert health.check(run.input()) == []
    # The gradient reaching fc2 is 1000x for one step: fc2 and fc1 before it rise alike, fc3
    # (after it) does not. fc1 has the largest absolute norm, fc2 is where it came from.
    run.add(1, fc1_weight=3000.0, fc1_bias=2000.0, fc2_weight=1000.0, fc2_bias=900.0)
    run.add(4)
    alert = only(health.check(run.input()), "gradient_spike")
    assert alert.step == 81
    assert alert.layers == ("fc2.weight", "fc2.bias")
    assert "step 81" in alert.message and "fc2.weight" in alert.message
    assert "\n" not in alert.message
    # One step: no explosion alert, and nothing more while the run stays healthy.
    run.add(200)
    assert health.check(run.input()) == []


def test_a_spike_in_every_layer_comes_from_the_loss() -> None:
    health, run = Health(), Run()
    run.add(60)
    health.check(run.input())
    run.add(1, **{name.replace(".", "_"): 500.0 for name in LAYERS})
    alert = only(health.check(run.input()), "gradient_spike")
    assert alert.layers == () and alert.subject == "grad_norm"
    assert "came from the loss" in alert.message


def _total_only(norms: np.ndarray, health: Health, every: int = 16) -> list[str]:
    """Check a run known by its total grad norm alone, every ``every`` steps as the sampler
    does (the last 512 steps each time); the rules raised, in order."""
    raised = []
    for end in range(every, norms.size + 1, every):
        lo = max(0, end - 512)
        steps = np.arange(lo + 1, end + 1, dtype=np.float64)
        cols = {"step": steps, "time": 1000.0 + steps, "grad_norm": norms[lo:end]}
        inp = HealthInput(step=end, time=1000.0 + end, steps=cols)
        raised += [a.rule for a in health.check(inp)]
    return raised


def test_a_converged_runs_heavy_tail_is_not_a_spike() -> None:
    # A classifier converged on small batches: most steps' gradients are tiny, one hard
    # sample now and then makes a step 10x-1000x the rest. At step 3001 one such step is
    # 2000x the usual and above where the run started: the run's own tail, not a spike.
    rng = np.random.default_rng(1)
    n = 4000
    step = np.arange(1, n + 1)
    floor = 1e-3 * rng.lognormal(0, 0.5, n)
    hard = rng.random(n) < 0.02
    floor[hard] *= 10 ** rng.uniform(1, 3, hard.sum())
    norms = 0.5 * np.exp(-step / 300) * rng.lognormal(0, 0.2, n) + floor
    norms[3000] = 2.0
    assert _total_only(norms, Health()) == []
    # The same run with steady norms (a narrow tail): a spike 50x the usual is named.
    steady = (0.5 * np.exp(-step / 300) + 1e-3) * rng.lognormal(0, 0.2, n)
    steady[3000] = 50 * steady[2900:3000].mean() + 0.6
    assert _total_only(steady, Health()) == ["gradient_spike"]


def test_an_early_heavy_tail_is_not_a_spike() -> None:
    # A classifier that converged within 50 steps: from then on its steps' norms spread over
    # two orders of magnitude. At step 112, with a hundred steps of tail known, one is 0.7,
    # above where the run started: its tail's shape is read from its top 10 rises, not 2.
    rng = np.random.default_rng(0)
    step = np.arange(1, 301)
    norms = 0.5 * np.exp(-step / 15) + 0.01 * rng.lognormal(0, 1.2, step.size)
    norms[111] = 0.7
    assert _total_only(norms, Health()) == []


def test_no_spike_below_the_factor_or_without_history() -> None:
    health, run = Health(), Run()
    run.add(60)
    run.add(1, fc3_weight=8.0)  # 3x the total: noise, not a spike
    assert health.check(run.input()) == []
    fresh, short = Health(), Run()
    short.add(10)
    short.add(1, fc3_weight=1e4)  # before min_history steps: nothing to judge against
    assert fresh.check(short.input()) == []
    # The factor is a threshold.
    strict, again = Health(Thresholds(grad_spike_factor=2.0)), Run()
    again.add(60)
    again.add(1, fc3_weight=8.0)
    assert rules(strict.check(again.input())) == ["gradient_spike"]


def test_a_quiet_check_takes_no_median_of_the_layers(monkeypatch) -> None:
    """Counted, not timed: while no layer's gradient rises above the run's maximum, no
    window can be an explosion, and the medians of every layer's reference window (a sort
    per layer, every check) are not taken; the one check that brings a rise takes them, and
    alerts as before."""
    import nbmonitor.health.rules.gradients as gradients

    taken: list[int] = []
    real = gradients.row_medians

    def counted(a):  # type: ignore[no-untyped-def]
        taken.append(a.shape[0])
        return real(a)

    monkeypatch.setattr(gradients, "row_medians", counted)
    health, run = Health(), Run()
    run.add(120)
    health.check(run.input())
    taken.clear()
    for _ in range(10):
        run.add(16)
        assert health.check(run.input()) == []
    assert all(rows == 1 for rows in taken)  # the total's, one row: never the layers'
    run.add(3, fc3_weight=50.0, fc3_bias=60.0)
    alert = only(health.check(run.input()), "exploding_gradients")
    assert alert.layers == ("fc3.weight", "fc3.bias")
    assert any(rows == len(LAYERS) for rows in taken)
