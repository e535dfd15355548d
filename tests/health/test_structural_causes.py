"""The structural causes on real tiny torch loops: each bug is named by its cause (one alert,
with its evidence, place and fix), and none of them fires on the healthy patterns it must
spare (tests/structural_loops.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests import structural_loops as loops
from torch import nn

STRUCTURAL = {
    "zero_grad_missing",
    "zero_grad_after_backward",
    "step_before_backward",
    "loss_detached",
    "softmax_before_cross_entropy",
    "loss_sum_reduction",
    "inputs_not_normalised",
    "eval_mode_during_training",
    "batchnorm_tiny_batch",
    "dropout_too_high",
    "fp16_params_with_adam",
    "fp16_without_scaler",
}


def sgd(lr: float) -> Callable[[nn.Module], torch.optim.Optimizer]:
    return lambda m: torch.optim.SGD(m.parameters(), lr=lr)


BROKEN: list[tuple[str, str, dict[str, Any]]] = [
    ("no_zero_grad", "zero_grad_missing", {"loop": loops.no_zero_grad}),
    ("zero_grad_between", "zero_grad_after_backward", {"loop": loops.zero_grad_between()}),
    (
        "zero_grad_between_in_place",
        "zero_grad_after_backward",
        {"loop": loops.zero_grad_between(set_to_none=False)},
    ),
    ("step_first", "step_before_backward", {"loop": loops.step_first}),
    ("item_loss", "loss_detached", {"loop": loops.item_loss}),
    ("no_grad_forward", "loss_detached", {"loop": loops.no_grad_forward}),
    ("softmax_ce", "softmax_before_cross_entropy", {"loop": loops.softmax_ce}),
    ("sigmoid_bce", "softmax_before_cross_entropy", {"loop": loops.sigmoid_bce_logits}),
    ("sum_sgd", "loss_sum_reduction", {"loop": loops.regression_sum, "optimizer": sgd(0.05)}),
    ("pixels", "inputs_not_normalised", {"loop": loops.scaled_inputs(255.0)}),
    ("thousands", "inputs_not_normalised", {"loop": loops.scaled_inputs(3000.0)}),
    ("eval", "eval_mode_during_training", {"loop": loops.left_in_eval, "model": loops.mlp(0.1)}),
    ("bn2", "batchnorm_tiny_batch", {"loop": loops.batches_of(2), "model": loops.mlp(bn=True)}),
    ("bn4", "batchnorm_tiny_batch", {"loop": loops.batches_of(4), "model": loops.mlp(bn=True)}),
    ("dropout99", "dropout_too_high", {"loop": loops.healthy, "model": loops.mlp(0.99)}),
    ("dropout9", "dropout_too_high", {"loop": loops.healthy, "model": loops.mlp(0.9)}),
    (
        "half_adam",
        "fp16_params_with_adam",
        {"loop": loops.half_params, "model": loops.mlp().half()},
    ),
    ("fp16_autocast", "fp16_without_scaler", {"loop": loops.autocast(torch.float16)}),
]


@pytest.mark.parametrize(("name", "rule", "setup"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_cause_is_named(tmp_path: Path, name: str, rule: str, setup: dict[str, Any]) -> None:
    setup = dict(setup)
    alerts, _ = loops.run(tmp_path, setup.pop("loop"), **setup)
    named = [a for a in alerts if a.rule == rule]
    detail = [(a.rule, a.step) for a in alerts]
    assert len(named) == 1, detail
    alert = named[0]
    assert alert.is_cause and alert.fix and alert.evidence, alert
    assert alert.step <= 10, detail  # every one of the first 8 steps is sampled
    # No other structural cause competes with the right one.
    assert not {a.rule for a in alerts} & (STRUCTURAL - {rule}), detail


def test_the_alerts_name_their_place(tmp_path: Path) -> None:
    alerts, _ = loops.run(tmp_path / "a", loops.scaled_inputs(255.0))
    (alert,) = [a for a in alerts if a.rule == "inputs_not_normalised"]
    assert alert.place == "0" and "0.weight" in alert.layers
    assert min(alert.evidence["input_abs_mean"]) > 100  # type: ignore[type-var]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3), nn.Softmax(dim=-1))
    alerts, _ = loops.run(tmp_path / "b", loops.healthy, model=model)
    (alert,) = [a for a in alerts if a.rule == "softmax_before_cross_entropy"]
    assert alert.place == "3" and alert.layers == ("3",)
    alerts, _ = loops.run(tmp_path / "c", loops.healthy, model=loops.mlp(0.95))
    (alert,) = [a for a in alerts if a.rule == "dropout_too_high"]
    assert alert.layers == ("2",) and alert.evidence["p"] == [0.95]


HEALTHY: list[tuple[str, dict[str, Any]]] = [
    ("plain", {"loop": loops.healthy}),
    ("eval_passes", {"loop": loops.with_eval_passes, "model": loops.mlp(0.5, bn=True)}),
    ("accumulation", {"loop": loops.accumulate, "model": loops.mlp(bn=True)}),
    ("zero_in_place", {"loop": loops.zero_in_place}),
    ("model_zero_grad", {"loop": loops.model_zero_grad}),
    ("clipped", {"loop": loops.clipped}),
    ("value_clipped", {"loop": loops.value_clipped}),
    ("zero_gradient", {"loop": loops.zero_gradient}),
    ("log_softmax_nll", {"loop": loops.log_softmax_nll}),
    ("bn32_dropout05", {"loop": loops.healthy, "model": loops.mlp(0.5, bn=True)}),
    ("bf16_autocast", {"loop": loops.autocast(torch.bfloat16)}),
    ("fp16_with_scaler", {"loop": loops.autocast(torch.float16, scaler=True)}),
    ("sum_with_adam", {"loop": loops.regression_sum}),
    ("no_dropout_in_eval", {"loop": loops.left_in_eval}),
    ("half_sgd", {"loop": loops.half_params, "model": loops.mlp().half(), "optimizer": sgd(0.01)}),
    ("unit_inputs", {"loop": loops.scaled_inputs(3.0)}),
]


def frozen_backbone() -> nn.Module:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.9)),
        nn.Linear(32, 3),
    )
    for p in model[0].parameters():
        p.requires_grad_(False)
    model[0].eval()
    return model


HEALTHY.append(("frozen_backbone_in_eval", {"loop": loops.healthy, "model": frozen_backbone()}))


@pytest.mark.parametrize(("name", "setup"), HEALTHY, ids=[h[0] for h in HEALTHY])
def test_healthy_patterns_raise_no_structural_cause(
    tmp_path: Path, name: str, setup: dict[str, Any]
) -> None:
    setup = dict(setup)
    alerts, _ = loops.run(tmp_path, setup.pop("loop"), **setup)
    assert [(a.rule, a.step, a.message) for a in alerts if a.rule in STRUCTURAL] == []
