"""Device rules: temperature, memory, throttling, idle, alone and through Health."""

from __future__ import annotations

from typing import Any

import numpy as np
from tests.health.synthetic import Run, only, rules

from nbmonitor.health import Health, Thresholds
from nbmonitor.health.rules import devices as device_health


def test_device_rules_pass_through_once() -> None:
    run, health = Run(), Health()
    run.add(30)
    run.system = {
        "step": np.array([29.0, 30.0]),
        "time": np.array([5.0, 6.0]),
        "gpu0_util_percent": np.array([99.0, 99.0]),
        "gpu0_temperature_c": np.array([80.0, 90.0]),
        "gpu1_util_percent": np.array([99.0, 99.0]),
        "gpu1_temperature_c": np.array([60.0, 60.0]),
    }
    alert = only(health.check(run.input()), "gpu_temperature")
    assert alert.message.startswith("GPU 0") and alert.step == 30
    assert alert.subject == "gpu0"
    run.add(1)
    assert health.check(run.input()) == []
    assert Health(Thresholds(temperature_c=95.0)).check(run.input()) == []


def columns(n: int = 30, **overrides: Any) -> dict[str, np.ndarray]:
    base: dict[str, Any] = {
        "step": np.arange(n, dtype=float),
        "time": np.arange(n, dtype=float) * 0.5,
        "gpu0_util_percent": np.full(n, 95.0),
        "gpu0_temperature_c": np.full(n, 60.0),
        "gpu0_mem_used_bytes": np.full(n, 40e9),
        "gpu0_mem_total_bytes": np.full(n, 80e9),
        "gpu0_throttle_mask": np.zeros(n),
    }
    base.update(overrides)
    return {k: np.asarray(v, dtype=float) for k, v in base.items()}


def test_healthy_device_raises_nothing() -> None:
    assert device_health.check(columns()) == []


def test_temperature_rule() -> None:
    hot = columns(gpu0_temperature_c=np.r_[np.full(29, 60.0), 86.0])
    [alert] = device_health.temperature_rule(hot)
    assert alert.rule == "gpu_temperature" and alert.severity == "warning"
    assert "86" in alert.message and alert.step == 29 and alert.time == 14.5
    assert alert.subject == "gpu0"
    assert device_health.temperature_rule(columns(gpu0_temperature_c=np.full(30, 84.0))) == []
    with_nan_tail = columns(gpu0_temperature_c=np.r_[np.full(29, 90.0), np.nan])
    assert rules(device_health.temperature_rule(with_nan_tail)) == ["gpu_temperature"]


def test_memory_rule() -> None:
    full = columns(gpu0_mem_used_bytes=np.full(30, 77e9))
    [alert] = device_health.memory_rule(full)
    assert alert.rule == "device_memory" and "96%" in alert.message
    assert device_health.memory_rule(columns(gpu0_mem_used_bytes=np.full(30, 72e9))) == []
    mps = {
        "step": np.arange(3.0),
        "mps_allocated_bytes": np.full(3, 99.0),
        "mps_recommended_max_bytes": np.full(3, 100.0),
    }
    assert "MPS" in device_health.memory_rule(mps)[0].message
    assert device_health.memory_rule(mps)[0].subject == "mps"


def test_throttle_rule() -> None:
    thermal = columns(gpu0_throttle_mask=np.full(30, float(0x40 | 0x1)))
    [alert] = device_health.throttle_rule(thermal)
    assert alert.severity == "warning" and "hw_thermal_slowdown" in alert.message
    assert "gpu_idle" not in alert.message
    [cap] = device_health.throttle_rule(columns(gpu0_throttle_mask=np.full(30, 4.0)))
    assert cap.severity == "info" and "sw_power_cap" in cap.message
    idle_only = columns(gpu0_throttle_mask=np.full(30, 1.0 + 0x10))  # idle + sync boost
    assert device_health.throttle_rule(idle_only) == []
    recovered = columns(gpu0_throttle_mask=np.r_[np.full(29, 64.0), 0.0])
    assert device_health.throttle_rule(recovered) == []


def test_idle_rule_fires_only_while_training() -> None:
    idle = columns(gpu0_util_percent=np.full(30, 12.0))
    [alert] = device_health.idle_rule(idle)
    assert alert.rule == "gpu_idle"
    assert "input-bound? check DataLoader num_workers / pin_memory" in alert.message
    paused = columns(step=np.full(30, 7.0), gpu0_util_percent=np.full(30, 0.0))
    assert device_health.idle_rule(paused) == []
    busy = columns(gpu0_util_percent=np.r_[np.full(10, 0.0), np.full(20, 90.0)])
    assert device_health.idle_rule(busy) == []
    too_short = columns(n=5, gpu0_util_percent=np.full(5, 0.0))
    assert device_health.idle_rule(too_short) == []
    assert device_health.idle_rule(idle, gpus=[1]) == []  # not the training GPU
    assert rules(device_health.check(idle, gpus=[0])) == ["gpu_idle"]


def test_each_device_is_its_own_subject() -> None:
    # Two hot GPUs: one alert each, and a third GPU heating later alerts on its own while the
    # first two keep holding (the episode is per device, read from Alert.subject).
    run, health = Run(), Health()
    run.add(30)
    hot = np.array([90.0, 90.0])
    run.system = {
        "step": np.array([29.0, 30.0]),
        "gpu0_util_percent": np.full(2, 99.0),
        "gpu0_temperature_c": hot,
        "gpu1_util_percent": np.full(2, 99.0),
        "gpu1_temperature_c": hot,
        "gpu2_util_percent": np.full(2, 99.0),
        "gpu2_temperature_c": np.full(2, 60.0),
    }
    first = health.check(run.input())
    assert [(a.rule, a.subject) for a in first] == [
        ("gpu_temperature", "gpu0"),
        ("gpu_temperature", "gpu1"),
    ]
    run.add(1)
    run.system = {**run.system, "gpu2_temperature_c": hot}
    [third] = health.check(run.input())
    assert (third.rule, third.subject) == ("gpu_temperature", "gpu2")
