"""The causes judged from the numbers: each named with its evidence from the ratios and trends
it implies (a milder setting of the same bug too), and silent on the healthy pattern that
looks most like it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tests.health import causes_data as data
from tests.health.synthetic import rules

from nbmonitor.health import Health


def named(inp: object, rule: str) -> list[str]:
    found = Health().check(inp)  # type: ignore[arg-type]
    assert rule in rules(found), rules(found)
    return rules(found)


def test_a_schedule_stepped_per_batch_is_named_with_the_lr_it_left() -> None:
    found = Health().check(data.schedule_per_batch(0.9))
    (alert,) = [a for a in found if a.rule == "lr_schedule_too_fast"]
    assert alert.is_cause and alert.fix and "once per epoch" in alert.fix
    ev = alert.evidence
    assert ev["lr_peak"] == 0.1 * 0.9 and ev["lr_now"] < 1e-3 * ev["lr_peak"]
    assert ev["collapsed_step"] < 0.8 * 1000 and ev["total_steps"] == 1000
    # Milder: gamma 0.97 takes ~230 steps to fall 1e3-fold; still long before the end.
    named(data.schedule_per_batch(0.97), "lr_schedule_too_fast")
    # Without the planned length: it has stayed ~0 longer than it took to get there.
    inp = data.schedule_per_batch(0.9)
    from dataclasses import replace

    named(replace(inp, total_steps=None), "lr_schedule_too_fast")


def test_schedules_that_end_near_zero_are_silent() -> None:
    n = 400
    cosine = data.run(
        n,
        loss=data.falling(1.0, 100.0),
        lr=lambda s: 0.05 * (1 + np.cos(np.pi * s / n)),
        total_steps=n,
    )
    assert "lr_schedule_too_fast" not in rules(Health().check(cosine))
    # Warm restarts: down to ~0 for a few steps every 100, back up after.
    restarts = data.run(
        n,
        loss=data.flat(1.0),
        lr=lambda s: 0.05 * (1 + np.cos(np.pi * (s % 100) / 100)),
        total_steps=n,
    )
    assert "lr_schedule_too_fast" not in rules(Health().check(restarts))


def test_an_lr_far_too_high_is_named_when_the_loss_climbs() -> None:
    found = Health().check(data.lr_high())
    (alert,) = [a for a in found if a.rule == "lr_too_high"]
    ev = alert.evidence
    assert ev["update_ratio_median"] == 0.5 and ev["loss_peak"] >= 2 * ev["loss_before"]
    assert alert.step >= 8 and "lower the learning rate" in alert.fix
    # The same large updates while the loss falls: healthy (momentum building up).
    assert "lr_too_high" not in rules(Health().check(data.lr_high(loss_climbs=False)))


def test_an_lr_far_too_low_is_told_from_a_damped_optimizer() -> None:
    found = Health().check(data.lr_low())
    (alert,) = [a for a in found if a.rule == "lr_too_low"]
    assert alert.evidence["lr"] == 1e-9 and "update_ratio_low" not in rules(found)
    named(data.lr_low(ratio=1e-7, lr=1e-7), "lr_too_low")  # milder
    # lr 1e-3 with steps a ten-thousandth of what plain SGD would make (Adam's eps=1e3): the
    # step does not follow the lr, so the lr is not what is wrong.
    damped = rules(Health().check(data.lr_low(ratio=1e-8, lr=1e-3)))
    assert "lr_too_low" not in damped and "update_ratio_low" in damped


def test_labels_not_matching_is_the_chance_level_with_healthy_updates() -> None:
    found = Health().check(data.labels())
    (alert,) = [a for a in found if a.rule == "labels_not_matching"]
    assert alert.evidence["chance_classes"] == 4
    assert "loss_plateau" not in rules(found)  # the symptom it explains
    named(data.labels(classes=10), "labels_not_matching")
    # The same flat loss with weights that barely move: a learning rate too low.
    assert "labels_not_matching" not in rules(Health().check(data.labels(ratio=1e-8)))
    # A loss that falls is learning.
    falling = data.run(300, loss=lambda s: math.log(4) * np.exp(-s / 200))
    assert "labels_not_matching" not in rules(Health().check(falling))


def test_weight_decay_that_collapses_the_weights_is_named_at_the_layers() -> None:
    found = Health().check(data.weight_decay())
    (alert,) = [a for a in found if a.rule == "weight_decay_too_high"]
    assert set(alert.layers) == {"fc1.weight", "fc2.weight", "fc3.weight"}
    assert alert.evidence["pull_share"] > 0.9
    named(data.weight_decay(shrink=0.01), "weight_decay_too_high")  # milder
    # Norms that shrink while the loss falls: the model learns (a light decay, or a norm
    # settling).
    learning = Health().check(data.weight_decay(loss=data.falling(1.0, 30.0)))
    assert "weight_decay_too_high" not in rules(learning)


def _without_ratios(run: Any) -> Any:
    """``run`` as a check sees it before its layer samples' update ratios have come."""
    from dataclasses import replace

    k = len(data.LAYERS)
    return replace(
        run,
        update_ratios=np.full(k, np.nan),
        update_steps=np.zeros(0),
        update_series=np.zeros((k, 0)),
        param_series=np.zeros((k, 0)),
    )


def test_an_lr_far_too_high_is_named_when_its_update_ratios_arrive_a_tick_late() -> None:
    # The update ratios come from the layer samples, which can reach a check after the steps
    # that followed them (a loaded machine): the loss rows already checked must still count.
    climb = lambda s: np.where(s >= 8, 5.0, 1.0)  # noqa: E731
    full = data.run(130, loss=climb, ratio=data.flat(0.5), lr=data.flat(1.0))
    early = data.run(120, loss=climb, ratio=data.flat(0.5), lr=data.flat(1.0))
    health = Health()
    first = health.check(_without_ratios(early))
    assert "lr_too_high" not in rules(first)
    (alert,) = [a for a in health.check(full) if a.rule == "lr_too_high"]
    assert alert.evidence["update_step"] == 1 and alert.step <= 101


def test_an_lr_far_too_high_is_named_when_its_update_ratios_come_after_the_last_rows() -> None:
    # The run's last check (at close) can bring the layer samples with no step row after the
    # ones already checked: the large update is judged against the rows there are.
    climb = lambda s: np.where(s >= 8, 5.0, 1.0)  # noqa: E731
    full = data.run(60, loss=climb, ratio=data.flat(0.5), lr=data.flat(1.0))
    health = Health()
    assert "lr_too_high" not in rules(health.check(_without_ratios(full)))
    (alert,) = [a for a in health.check(full) if a.rule == "lr_too_high"]
    assert alert.evidence["update_step"] == 1 and alert.step <= 60
