"""The fine-tuning rules and the "is it training" verdict on synthetic LoRA runs: a healthy one
(B leaves zero after its first update) raises nothing and reads "learning"; adapters that never
move are named with the gradient's evidence; adapters that move by far too little a step are
named as an lr too small; the setup causes come from the layout alone."""

from __future__ import annotations

import dataclasses
import math

from tests.health.adapter_runs import (
    NAMES,
    healthy,
    lora_adapters,
    lora_input,
    stuck,
    too_slow,
)
from tests.health.synthetic import only

from nbmonitor.health import Alert, Health
from nbmonitor.health.adapters import Adapters, AdapterTensor
from nbmonitor.health.finetune import (
    LEARNING,
    MIN_UPDATES,
    NOT_LEARNING,
    NOT_TRAINED,
    TOO_SLOW,
    WAITING,
    AdapterWatch,
)
from nbmonitor.health.rules.finetune import setup_explained, setup_findings

FINETUNE_RULES = {"adapters_not_learning", "adapter_lr_too_small"}


def fine_tune_alerts(inp: object) -> list[str]:
    alerts = Health().check(inp)  # type: ignore[arg-type]
    return [a.rule for a in alerts if a.rule in FINETUNE_RULES]


def test_healthy_lora_raises_nothing_and_reads_learning() -> None:
    inp = healthy(80)
    assert fine_tune_alerts(inp) == []
    watch = AdapterWatch(inp.adapters)  # type: ignore[arg-type]
    watch.observe(inp)
    verdict = watch.verdict()
    assert verdict.state == LEARNING
    assert verdict.b_left_zero == verdict.b_zero_start == 2
    assert verdict.grads == "non-zero"
    assert verdict.text.startswith("adapters learning: 4 LoRA matrices, B left zero in 2 of 2")
    assert "grads non-zero" in verdict.text


def test_zero_b_in_the_first_steps_is_waiting_not_stuck() -> None:
    # Before MIN_UPDATES measured updates, B at zero is how LoRA starts.
    inp = stuck(MIN_UPDATES)
    watch = AdapterWatch(inp.adapters)  # type: ignore[arg-type]
    watch.observe(inp)
    assert not watch.stuck()
    assert watch.verdict().state == WAITING
    assert fine_tune_alerts(inp) == []


def test_b_that_moves_after_the_first_update_is_learning() -> None:
    inp = lora_input(3, b_step=1e-3, a_ratio=0.0, grad=0.5)
    watch = AdapterWatch(inp.adapters)  # type: ignore[arg-type]
    watch.observe(inp)
    assert watch.learning()


def test_adapters_that_never_move_without_gradient_are_named() -> None:
    alerts = Health().check(stuck(60))
    alert = only(alerts, "adapters_not_learning")
    assert alert.layers == NAMES
    assert "B stays exactly at zero" in alert.message
    assert alert.cause.startswith("no gradient reaches the adapters")
    assert "enable_input_require_grads" in alert.fix
    assert alert.evidence["grads"] == "none" and alert.evidence["left_zero"] == 0
    assert alert.step <= 50


def test_no_gradient_anywhere_is_the_loss_cut_not_the_adapters() -> None:
    # Nothing else tracked gets a gradient either: the loss is cut from the model (a cause of
    # its own); the verdict still says the adapters do not learn.
    inp = lora_input(60, b_step=0.0, a_ratio=0.0, grad=math.nan, loss=1.0, head=False)
    assert fine_tune_alerts(inp) == []
    watch = AdapterWatch(lora_adapters())
    watch.observe(inp)
    assert watch.verdict().state == NOT_LEARNING


def test_zero_gradient_and_nonzero_gradient_are_told_apart() -> None:
    zero = only(Health().check(stuck(60, grad=0.0)), "adapters_not_learning")
    assert zero.cause.startswith("the adapters' gradient is exactly zero")
    arriving = only(Health().check(stuck(60, grad=0.3)), "adapters_not_learning")
    assert arriving.cause.startswith("gradients reach the adapters but the optimizer")
    assert "grads non-zero (median norm 0.3)" in arriving.message


def test_verdict_says_not_learning_with_its_evidence() -> None:
    inp = stuck(40, grad=0.0)
    watch = AdapterWatch(inp.adapters)  # type: ignore[arg-type]
    watch.observe(inp)
    verdict = watch.verdict()
    assert verdict.state == NOT_LEARNING
    assert verdict.updates == 39  # every step from the second
    assert verdict.text == (
        "adapters NOT learning: 4 LoRA matrices, B stays at zero after 39 measured updates, "
        "grads exactly zero"
    )


def test_judged_slice_by_slice_as_at_once() -> None:
    # The same run checked in pieces reaches the same account.
    whole = AdapterWatch(lora_adapters())
    whole.observe(healthy(60))
    pieces = AdapterWatch(lora_adapters())
    for n in (5, 17, 33, 60):
        pieces.observe(healthy(n))
    assert whole.verdict() == pieces.verdict()


def test_lr_far_too_small_is_named_once_with_the_lr() -> None:
    health = Health()
    alerts = health.check(too_slow(60))
    alert = only(alerts, "adapter_lr_too_small")
    assert "lr 1.0e-03 (group 0)" in alert.message
    assert alert.fix.startswith("raise the adapters' learning rate")
    assert alert.evidence["update_ratio"] == 1e-9
    assert "adapters_not_learning" not in [a.rule for a in alerts]
    # Held, not raised again.
    assert "adapter_lr_too_small" not in [a.rule for a in health.check(too_slow(90))]
    watch = AdapterWatch(lora_adapters())
    watch.observe(too_slow(60))
    assert watch.verdict().state == TOO_SLOW


def test_updates_that_round_away_are_an_lr_too_small() -> None:
    # Adam at lr 1e-9 on float32 weights of ~0.1: A's updates are below its precision (||Δw||
    # exactly 0) while B creeps off zero; the gradients are not zero.
    inp = lora_input(60, b_step=1e-9, a_ratio=0.0, grad=0.5, loss=1.0)
    alert = only(Health().check(inp), "adapter_lr_too_small")
    assert "round away to nothing" in alert.message
    assert alert.evidence["update_ratio"] == 0.0
    # The same with lr 0 in the optimizer is lr_zero's (a setup check), not this.
    zero = lora_input(60, b_step=1e-9, a_ratio=0.0, grad=0.5, loss=1.0, adapters=lora_adapters(0.0))
    assert "adapter_lr_too_small" not in [a.rule for a in Health().check(zero)]


def test_small_updates_with_a_falling_loss_are_not_too_slow() -> None:
    falling = lora_input(60, b_step=1e-9, a_ratio=1e-9, grad=0.5)
    assert "adapter_lr_too_small" not in fine_tune_alerts(falling)


def test_no_adapters_no_verdict_and_no_alert() -> None:
    inp = healthy(60)
    plain = type(inp)(**{**inp.__dict__, "adapters": None})
    assert fine_tune_alerts(plain) == []


def test_reset_forgets_the_account() -> None:
    health = Health()
    health.check(stuck(60))
    health.reset()
    assert fine_tune_alerts(healthy(60)) == []


# -- setup causes ------------------------------------------------------------------------------


def setup_alerts(ad: Adapters) -> list[Alert]:
    """What Health raises for the layout ``ad`` on a healthy-looking run."""
    inp = healthy(40)
    return [
        a
        for a in Health().check(dataclasses.replace(inp, adapters=ad))
        if a.rule in ("adapters_not_trained", "base_not_frozen")
    ]


def test_frozen_adapters_are_not_trained() -> None:
    ad = lora_adapters(trainable=False)
    alert = only(setup_alerts(ad), "adapters_not_trained")
    assert alert.layers == NAMES and alert.step == 1 and alert.severity == "error"
    assert alert.cause.startswith("the adapters are frozen")
    assert "is_trainable=True" in alert.fix
    assert alert.evidence["frozen"] == list(NAMES)
    assert setup_explained(ad) == set(NAMES)


def test_adapters_missing_from_the_optimizer_are_not_trained() -> None:
    alert = only(setup_alerts(lora_adapters(in_optimizer=False)), "adapters_not_trained")
    assert "4 LoRA matrices not in the optimizer" in alert.message
    assert alert.fix.startswith("build the optimizer after adding the adapters")
    # Without an optimizer at attach (adopted later), missing is not judged.
    unknown = dataclasses.replace(lora_adapters(in_optimizer=False), optimizer_known=False)
    assert setup_findings(unknown) == []
    watch = AdapterWatch(lora_adapters(in_optimizer=False))
    assert watch.verdict().state == NOT_TRAINED
    assert AdapterWatch(unknown).verdict().state == WAITING


def test_the_cause_takes_in_the_symptoms_it_explains() -> None:
    # Adapters missing from the optimizer: A gets a zero gradient (B stays zero), which alone
    # reads as vanishing gradients; the cause takes that in.
    ad = lora_adapters(in_optimizer=False)
    health = Health()
    raised = []
    for n in (16, 32, 48, 64):
        inp = lora_input(n, b_step=0.0, a_ratio=0.0, grad=0.0, loss=1.0, adapters=ad)
        raised += health.check(inp)
    assert [a.rule for a in raised] == ["adapters_not_trained"]


def _peft_two_adapters(active_trainable: bool) -> Adapters:
    tensors = []
    for adapter, trainable in (("default", active_trainable), ("other", False)):
        for role in ("A", "B"):
            name = f"m.0.lora_{role}.{adapter}.weight"
            tensors.append(
                AdapterTensor(name, role, "m.0", 64, trainable, True, 0, 1e-3, role == "B")
            )
    return Adapters("LoRA (peft)", tuple(tensors), 4096, 0)


def test_an_inactive_peft_adapter_frozen_on_purpose_is_silent() -> None:
    assert setup_findings(_peft_two_adapters(active_trainable=True)) == []
    found = setup_findings(_peft_two_adapters(active_trainable=False))
    assert [f.rule for f in found] == ["adapters_not_trained"]


def test_base_stepped_beside_its_adapters_is_not_frozen() -> None:
    base = Adapters(
        "LoRA",
        lora_adapters().tensors,
        base_numel=4096,
        base_trainable_numel=4096,
        base_stepped=("l0.base.weight", "l1.base.weight"),
        base_stepped_count=2,
        base_stepped_numel=4096,
        wrapped_trainable=("l0.base.weight", "l1.base.weight"),
    )
    alert = only(setup_alerts(base), "base_not_frozen")
    assert alert.severity == "error"
    assert alert.layers == ("l0.base.weight", "l1.base.weight")
    assert "including the weights the adapters wrap" in alert.message
    assert alert.evidence["base_stepped_values"] == 4096
    assert setup_explained(base) == {"l0.base.weight", "l1.base.weight"}


def test_a_base_that_requires_grad_outside_the_optimizer_is_said_as_waste() -> None:
    base = Adapters(
        "LoRA",
        lora_adapters().tensors,
        base_numel=4096,
        base_trainable_numel=4096,
        base_unstepped=("l0.base.weight",),
        base_unstepped_count=1,
    )
    alert = only(setup_alerts(base), "base_not_frozen")
    assert alert.severity == "warning"
    assert "never applied" in alert.message


def test_a_few_norms_trained_on_purpose_are_not_a_base_that_trains() -> None:
    norms = Adapters(
        "LoRA",
        lora_adapters().tensors,
        base_numel=4096,
        base_trainable_numel=64,
        base_stepped=("ln.weight",),
        base_stepped_count=1,
        base_stepped_numel=64,
    )
    assert setup_findings(norms) == []
    assert setup_alerts(norms) == []


def test_a_trainable_part_raises_no_setup_cause() -> None:
    part = Adapters("trainable part", lora_adapters(trainable=False).tensors, 4096, 0)
    assert setup_findings(part) == []


def test_layout_round_trips_through_meta_json() -> None:
    ad = lora_adapters(lr=2e-4)
    assert Adapters.from_json(ad.to_json()) == ad
    unknown = Adapters.from_json(lora_adapters(lr=math.nan).to_json())
    assert unknown is not None and all(math.isnan(t.lr) for t in unknown.tensors)
    assert Adapters.from_json({"tensors": "junk"}) is None
    assert Adapters.from_json([1, 2]) is None
