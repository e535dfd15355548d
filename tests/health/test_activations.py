"""Activation rules: dead units."""

from __future__ import annotations

from tests.health.synthetic import Run, only

from nbmonitor.health import Health, Thresholds


def test_dead_units_names_modules_after_warmup() -> None:
    run, health = Run(), Health()
    run.activations = {"net.1": {"zero_frac": 1.0}, "net.3": {"zero_frac": 0.5}}
    run.add(5)
    assert health.check(run.input()) == []  # zero-initialised branches are dead at first
    run.add(20)
    alert = only(health.check(run.input()), "dead_units")
    assert alert.layers == ("net.1",) and "net.1" in alert.message
    run.add(1)
    assert health.check(run.input()) == []
    lenient = Health(Thresholds(dead_fraction=1.0))
    run.activations = {"net.1": {"zero_frac": 0.995}}
    assert lenient.check(run.input()) == []
