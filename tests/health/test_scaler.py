"""scaler_skipping: a GradScaler that keeps skipping optimizer steps."""

from __future__ import annotations

from tests.health.synthetic import Run, only, rules

from nbmonitor.health import Health


def test_skipping_over_and_over_is_reported_when_the_count_is_reached() -> None:
    run, health = Run(), Health()
    run.add(30)
    run.add(25, skipped=True)
    alert = only(health.check(run.input()), "scaler_skipping")
    assert alert.step == 50 and "skipped 20 of the last 40" in alert.message
    run.add(10, skipped=True)
    assert health.check(run.input()) == []


def test_calibration_and_occasional_skips_are_silent() -> None:
    run, health = Run(), Health()
    run.add(12, skipped=True)  # the scaler finding its scale at the start
    for _ in range(40):  # then one skip every ~100 steps (growth tried and backed off)
        run.add(99)
        run.add(1, skipped=True)
        assert "scaler_skipping" not in rules(health.check(run.input()))
