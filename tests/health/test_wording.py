"""How messages name layers and fit their advice to the model."""

from __future__ import annotations

import numpy as np
from tests.health.synthetic import Run, only

from nbmonitor.health import Health
from nbmonitor.health.wording import label, layer_list

KINDS = {"0": "Linear", "1": "ReLU", "encoder": "Block", "encoder.3": "GELU"}


def test_layers_of_a_sequential_are_named_as_layers() -> None:
    assert label("1", KINDS) == "layer 1 (ReLU)"
    assert label("0.weight", KINDS) == "0.weight (Linear)"
    assert label("encoder.3", KINDS) == "encoder.3 (GELU)"
    assert label("encoder.norm.weight", KINDS) == "encoder.norm.weight"
    assert label("7") == "layer 7"  # kind unknown
    assert label("head.bias", KINDS) == "head.bias"
    assert layer_list(["1", "0.weight"], KINDS) == "layer 1 (ReLU), 0.weight (Linear)"


def test_dead_units_message_names_the_layer_and_fits_the_model() -> None:
    run, health = Run(), Health()
    run.module_kinds = {"3": "ReLU", "4": "Linear"}
    run.activations = {"3": {"zero_frac": 1.0}}
    run.add(25)
    alert = only(health.check(run.input()), "dead_units")
    assert "layer 3 (ReLU)" in alert.message and "dead ReLUs" in alert.message
    assert alert.layers == ("3",)


def test_vanishing_advice_fits_the_model() -> None:
    for kinds, sigmoid in (({"0": "Linear", "1": "Sigmoid"}, True), ({"1": "ReLU"}, False)):
        run, health = Run(), Health()
        run.module_kinds = kinds
        run.param_norms = np.full(len(run.layers), 10.0)
        run.add(25, fc1_weight=1e-9)
        alert = only(health.check(run.input()), "vanishing_gradients")
        assert ("Sigmoid stack with ReLU/GELU" in alert.message) == sigmoid
        assert "normalisation" in alert.message


def test_zero_gradients_with_dead_units_are_left_to_dead_units() -> None:
    run, health = Run(), Health()
    run.param_norms = np.full(len(run.layers), 10.0)
    run.activations = {"act1": {"zero_frac": 1.0}}
    run.add(25, fc1_weight=0.0, fc1_bias=0.0)
    found = health.check(run.input())
    assert [a.rule for a in found] == ["dead_units"]
    # Without activation statistics the zeros are reported, as zeros, not as "vanishing".
    run2, health2 = Run(), Health()
    run2.param_norms = np.full(len(run2.layers), 10.0)
    run2.add(25, fc1_weight=0.0)
    alert = only(health2.check(run2.input()), "vanishing_gradients")
    assert "exactly zero" in alert.message and "ReLU/GELU" not in alert.message
