"""Structural facts as the training side would record them (health/structure.py), for the
structural rules' tests without torch: one fake per cause, and the healthy facts beside them.
``inputs()`` gives a HealthInput raising each structural rule once."""

from __future__ import annotations

import dataclasses
import math

from tests.health.synthetic import Run

from nbmonitor.health import HealthInput
from nbmonitor.health.structure import Observation, Structure

MODEL = Observation(
    0,
    "model",
    {
        "modes": (("2", "Dropout", True, ()), ("1", "BatchNorm1d", True, ("1.weight", "1.bias"))),
        "first_layer": "0",
        "first_layer_kind": "Linear",
        "first_layer_params": ("0.weight", "0.bias"),
        "softmax_modules": ("4",),
        "sigmoid_modules": (),
    },
)
ADAM = Observation(
    0,
    "optimizer",
    {
        "name": "Adam",
        "adaptive": True,
        "groups": ((1e-3, 0.0, 1e-8, 4, "float32"),),
        "float16_params": 0,
        "float16_names": (),
    },
)


def backward(step: int, **facts: object) -> Observation:
    base: dict[str, object] = {
        "leaf_root": False,
        "reached": 4,
        "complete": True,
        "root": "NllLossBackward0",
        "probabilities_into": None,
        "loss_node": "NllLossBackward0",
        "reduction": "mean",
        "nodes": 12,
        "forwarded": True,
        "grads_kept": False if step > 1 else None,
        "scaled": False,
    }
    return Observation(step, "backward", {**base, **facts})


def forward(step: int, **facts: object) -> Observation:
    base: dict[str, object] = {
        "modes": (("2", True, 0.1), ("1", True, None)),
        "autocast": None,
        "device": "cpu",
        "first_layer": "0",
        "input_abs_mean": 0.8,
        "input_abs_max": 3.5,
    }
    return Observation(step, "forward", {**base, **facts})


def observed(
    steps: int = 10,
    backward_facts: dict[str, object] | None = None,
    forward_facts: dict[str, object] | None = None,
    pre_step: dict[str, object] | None = None,
    batch: int = 32,
    optimizer: Observation = ADAM,
) -> Structure:
    """A structure observed on steps 1..steps, healthy unless facts say otherwise."""
    obs = [MODEL, optimizer]
    for s in range(1, steps + 1):
        obs.append(forward(s, **(forward_facts or {})))
        obs.append(
            Observation(
                s,
                "batchnorm",
                {"module": "1", "kind": "BatchNorm1d", "batch": batch, "per_channel": batch},
            )
        )
        obs.append(backward(s, **(backward_facts or {})))
        facts = {"grad_present": True, "rewritten": False, **(pre_step or {})}
        obs.append(Observation(s, "pre_step", facts))
    return Structure(tuple(obs))


def with_structure(structure: Structure, steps: int = 40, loss: float | None = None) -> HealthInput:
    run = Run()
    run.add(steps, loss=loss)
    return dataclasses.replace(run.input(), structure=structure)


HALF = dataclasses.replace(
    ADAM, facts={**ADAM.facts, "float16_params": 4, "float16_names": ("0.weight", "0.bias")}
)

# One input per structural rule, raising it.
CASES: dict[str, HealthInput] = {
    "zero_grad_missing": with_structure(observed(backward_facts={"grads_kept": True})),
    "zero_grad_after_backward": with_structure(observed(pre_step={"grad_present": False})),
    "step_before_backward": with_structure(observed(backward_facts={"forwarded": False})),
    "loss_detached": with_structure(
        observed(backward_facts={"leaf_root": True, "reached": 0, "root": None})
    ),
    "softmax_before_cross_entropy": with_structure(
        observed(backward_facts={"probabilities_into": "cross_entropy"})
    ),
    "loss_sum_reduction": with_structure(
        observed(backward_facts={"reduction": "sum"}, forward_facts={"input_shape": (64, 8)}),
        loss=math.nan,
    ),
    "inputs_not_normalised": with_structure(
        observed(forward_facts={"input_abs_mean": 120.0, "input_abs_max": 255.0})
    ),
    "eval_mode_during_training": with_structure(
        observed(forward_facts={"modes": (("2", False, 0.1), ("1", False, None))})
    ),
    "batchnorm_tiny_batch": with_structure(observed(batch=2)),
    "dropout_too_high": with_structure(
        observed(forward_facts={"modes": (("2", True, 0.95), ("1", True, None))})
    ),
    "fp16_params_with_adam": with_structure(observed(optimizer=HALF)),
    "fp16_without_scaler": with_structure(
        observed(forward_facts={"autocast": "float16", "device": "cuda"})
    ),
}


def inputs() -> list[HealthInput]:
    return list(CASES.values())
