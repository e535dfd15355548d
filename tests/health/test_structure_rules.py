"""The structural rules on the facts alone (tests/health/structure_cases.py: what the training
side would read), without torch: each cause from its facts, and silence where the facts are
healthy, seen once only, or lack the sign a cause needs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from tests.health import structure_cases as cases

from nbmonitor.health import Health
from nbmonitor.health.structure import Observation, Structure, streak_step

STRUCTURAL = set(cases.CASES)


def raised(inp: object) -> list[str]:
    return [a.rule for a in Health().check(inp)]  # type: ignore[arg-type]


@pytest.mark.parametrize("rule", sorted(cases.CASES))
def test_each_cause_from_its_facts(rule: str) -> None:
    alerts = Health().check(cases.CASES[rule])
    named = [a for a in alerts if a.rule in STRUCTURAL]
    assert [a.rule for a in named] == [rule]
    alert = named[0]
    assert alert.is_cause and alert.fix and alert.evidence and alert.place
    assert alert.message.count(". ") >= 1  # cause (evidence). Fix.


def test_healthy_facts_raise_nothing() -> None:
    assert raised(cases.with_structure(cases.observed())) == []


@pytest.mark.parametrize(
    "facts",
    [
        {"backward_facts": {"grads_kept": True}},
        {"pre_step": {"grad_present": False}},
        {"backward_facts": {"forwarded": False}},
        {"forward_facts": {"modes": (("2", False, 0.1), ("1", False, None))}},
        {"batch": 2},
    ],
)
def test_a_fact_seen_once_is_not_a_verdict(facts: dict[str, object]) -> None:
    structure = cases.observed(steps=1, **facts)  # type: ignore[arg-type]
    assert not set(raised(cases.with_structure(structure))) & STRUCTURAL


def test_fp16_without_scaler_needs_float16_and_no_scaler() -> None:
    scaled = cases.observed(
        forward_facts={"autocast": "float16", "device": "cuda"}, backward_facts={"scaled": True}
    )
    bf16 = cases.observed(forward_facts={"autocast": "bfloat16", "device": "cuda"})
    assert raised(cases.with_structure(scaled)) == []
    assert raised(cases.with_structure(bf16)) == []


def test_a_sum_reduction_that_trains_is_left_alone() -> None:
    # A summed loss under Adam (scale-free): no sign of steps too large.
    summed = cases.observed(backward_facts={"reduction": "sum"})
    assert raised(cases.with_structure(summed)) == []
    # A batch of one: sum and mean are the same.
    one = cases.observed(backward_facts={"reduction": "sum"}, forward_facts={"input_shape": (1, 8)})
    assert "loss_sum_reduction" not in raised(cases.with_structure(one, loss=math.nan))


def test_large_updates_that_bring_the_loss_down_are_no_sign_of_a_sum() -> None:
    from tests.health.synthetic import Run

    summed = cases.observed(backward_facts={"reduction": "sum"},
                            forward_facts={"input_shape": (64, 8)})  # fmt: skip
    run = Run()
    run.add(150)  # the loss falls (healthy noise around a decaying level)
    run.update_ratios = np.full(len(run.layers), 0.05)  # large steps, as early in a run
    falling = dataclasses.replace(run.input(), structure=summed)
    # An lr scaled for the sum (or a fresh model's first steps): the loss comes down.
    assert "loss_sum_reduction" not in raised(falling)
    flat = Run()
    flat.add(150, loss=1.0)
    flat.update_ratios = np.full(len(flat.layers), 0.05)
    # The same steps while the loss does not fall: too large for it.
    assert "loss_sum_reduction" in raised(dataclasses.replace(flat.input(), structure=summed))


def test_dropout_and_batchnorm_at_healthy_settings() -> None:
    mild = cases.observed(forward_facts={"modes": (("2", True, 0.5), ("1", True, None))}, batch=8)
    assert raised(cases.with_structure(mild)) == []
    # A high p in eval() is off: that is eval mode's alert, not dropout's.
    off = cases.observed(forward_facts={"modes": (("2", False, 0.99), ("1", False, None))})
    assert raised(cases.with_structure(off)) == ["eval_mode_during_training"]


def test_fp16_params_with_sgd_are_not_adams_fault() -> None:
    sgd = dataclasses.replace(
        cases.HALF, facts={**cases.HALF.facts, "name": "SGD", "adaptive": False}
    )
    assert raised(cases.with_structure(cases.observed(optimizer=sgd))) == []


def test_the_alert_is_stamped_where_its_streak_reached_its_count() -> None:
    alerts = Health().check(cases.CASES["zero_grad_missing"])
    (alert,) = [a for a in alerts if a.rule == "zero_grad_missing"]
    # Kept on steps 1, 2, 3: three in a row by step 3 (the check ran at step 40).
    assert alert.step == 3
    obs = tuple(Observation(s, "x", {"v": s > 5}) for s in range(1, 10))
    assert streak_step(obs, 2, lambda o: o.get("v")) == 7
    assert streak_step(obs, 5, lambda o: o.get("v")) is None


def test_a_cause_takes_in_the_symptoms_it_explains() -> None:
    from tests.health.synthetic import Run

    run = Run()
    run.add(20)
    run.add(20, loss=math.nan)  # the steps grow too large: the loss is lost at step 21
    inp = dataclasses.replace(
        run.input(), structure=cases.observed(backward_facts={"reduction": "sum"},
                                              forward_facts={"input_shape": (64, 8)})
    )  # fmt: skip
    alerts = Health().check(inp)
    rules = [a.rule for a in alerts]
    assert "loss_sum_reduction" in rules and "loss_non_finite" not in rules
    (cause,) = [a for a in alerts if a.rule == "loss_sum_reduction"]
    assert cause.explains == (("loss_non_finite", 21),) and cause.step == 21


def test_the_structure_is_cut_at_each_slice() -> None:
    structure = cases.observed(steps=10)
    assert structure.until(3).latest("backward").step == 3  # type: ignore[union-attr]
    assert Structure().until(3) == Structure()
