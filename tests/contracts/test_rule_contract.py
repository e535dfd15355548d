"""Every registered health rule meets the Rule protocol, and every alert names its subject as
data: nothing in nbmonitor.health reads an alert's wording."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from tests.health import causes_data, structure_cases
from tests.health.adapter_runs import healthy, lora_adapters, stuck, too_slow
from tests.health.synthetic import LAYERS, Run

import nbmonitor.health
from nbmonitor.health import (
    RULES,
    Alert,
    Health,
    HealthInput,
    HealthView,
    Outcome,
    Rule,
    RuleFactory,
    Thresholds,
    non_finite_gradients,
)
from nbmonitor.health.alert import GRAD_NORM, LOSS, is_subject
from nbmonitor.health.alert import LAYERS as LAYERS_SUBJECT
from nbmonitor.health.view import RankColumns, RankProgress
from nbmonitor.records import OptimizerRecord

EMPTY = HealthInput(step=0, time=0.0, steps={})


def typical() -> HealthInput:
    """A healthy run with every input filled: steps, layers, ratios, activations, a GPU."""
    run = Run()
    run.add(150)
    run.update_ratios = np.full(len(LAYERS), 1e-3)
    run.activations = {"act1": {"zero_frac": 0.5}}
    n = 30
    run.system = {
        "step": np.linspace(120.0, 150.0, n),
        "gpu0_util_percent": np.full(n, 95.0),
        "gpu0_temperature_c": np.full(n, 60.0),
        "gpu0_mem_used_bytes": np.full(n, 40e9),
        "gpu0_mem_total_bytes": np.full(n, 80e9),
        "gpu0_throttle_mask": np.zeros(n),
    }
    return run.input()


def view(inp: HealthInput) -> HealthView:
    return HealthView(inp, None, None, Thresholds().window)


@pytest.mark.parametrize("factory", RULES, ids=lambda f: getattr(f, "name", repr(f)))
def test_rule_meets_the_protocol(factory: RuleFactory) -> None:
    rule = factory(Thresholds())
    assert isinstance(rule, Rule)
    assert isinstance(rule.name, str) and rule.name
    for inp in (EMPTY, typical()):
        outcome = rule.check(view(inp))
        assert isinstance(outcome, Outcome)
        assert outcome.rule == rule.name
        assert list(outcome.held) == []  # healthy or empty: nothing holds
        assert isinstance(outcome.judged(LAYERS[0]), bool)
    rule.reset()
    again = rule.check(view(typical()))
    assert again.rule == rule.name and list(again.held) == []


def test_rule_names_are_unique() -> None:
    names = [factory(Thresholds()).name for factory in RULES]
    assert len(names) == len(set(names))


def test_reset_restores_a_fresh_rule() -> None:
    # After reset a rule judges like a new one: the same alerts from the same data.
    run = Run()
    run.add(120)
    run.add(3, fc3_weight=80.0)
    inp = run.input()
    fresh = Health().check(inp)
    used = Health()
    used.check(inp)
    used.reset()
    assert used.check(inp) == fresh and fresh


def every_alert() -> list[Alert]:
    """At least one alert from every registered rule (and the engine-worded report)."""
    alerts: list[Alert] = []
    # Exploding layers, then the total norm alone.
    run, health = Run(), Health()
    run.add(120)
    health.check(run.input())
    run.add(3, fc3_weight=80.0)
    alerts += health.check(run.input())
    total = run.input()
    grad = total.steps["grad_norm"].copy()
    grad[-3:] *= 40
    alerts += Health().check(
        HealthInput(step=total.step, time=total.time, steps={**total.steps, "grad_norm": grad})
    )
    # Vanishing, update ratios, dead units.
    run, health = Run(), Health()
    run.param_norms = np.full(len(LAYERS), 10.0)
    run.activations = {"act1": {"zero_frac": 1.0}}
    run.add(40, loss=1.0)  # not falling: large updates are then too high
    for i in range(3):
        ratios = np.full(len(LAYERS), 1e-3)
        ratios[LAYERS.index("fc2.weight")] = 0.5 + i / 10
        ratios[LAYERS.index("fc3.weight")] = 1e-8 * (1 + i)
        run.update_ratios = ratios
        run.add(1, fc1_weight=1e-9, loss=1.0)
        alerts += health.check(run.input())
    run.add(20, fc1_weight=1e-9)
    alerts += health.check(run.input())
    # Non-finite loss, spike, plateau.
    run, health = Run(), Health()
    run.add(60, loss=1.0)
    run.loss = [1.0 + 0.05 * np.sin(i) for i in range(60)]
    health.check(run.input())
    run.add(3, loss=12.0)
    alerts += health.check(run.input())
    run.add(1, loss=float("nan"))
    alerts += health.check(run.input())
    alerts += Health(Thresholds(plateau_window=40)).check(flat())
    # Clipping on every step, the GradScaler skipping over and over.
    run = Run()
    run.add(60, clip=0.1, skipped=True)
    alerts += Health().check(run.input())
    # Devices: two GPUs and MPS, every device rule.
    n = 30
    run, health = Run(), Health()
    run.add(30)
    run.system = {
        "step": np.arange(1.0, n + 1),
        "gpu0_util_percent": np.full(n, 5.0),
        "gpu0_temperature_c": np.full(n, 90.0),
        "gpu0_throttle_mask": np.full(n, float(0x40)),
        "gpu1_util_percent": np.full(n, 95.0),
        "gpu1_mem_used_bytes": np.full(n, 79e9),
        "gpu1_mem_total_bytes": np.full(n, 80e9),
        "mps_allocated_bytes": np.full(n, 99.0),
        "mps_recommended_max_bytes": np.full(n, 100.0),
    }
    alerts += health.check(run.input())
    # Memory: the step's peak near the limit, allocation retries climbing, memory growing.
    n = 40
    run, health = Run(), Health()
    run.add(40)
    run.system = {
        "step": np.arange(10.0, 10.0 + n),
        "time": np.arange(float(n)),
        "cuda_allocated_bytes": 1e9 + np.arange(n) * 2.0**22,
        "cuda_interval_peak_bytes": np.full(n, 76e9),
        "cuda_total_bytes": np.full(n, 80e9),
        "cuda_alloc_retries": np.arange(float(n)),
    }
    alerts += health.check(run.input())
    alerts += Health().check(HealthInput(step=120, time=0.0, steps={}, ranks=straggling()))
    alerts += Health().check(HealthInput(step=30, time=0.0, steps={}, ranks=replicated()))
    alerts += Health().check(HealthInput(step=30, time=0.0, steps={}, ranks=stalled()))
    alerts += Health().check(HealthInput(step=30, time=0.0, steps={}, ranks=unsynced()))
    # Time: input-bound and the optimizer's share (a for-loop Adam) held for over 100 steps,
    # then the steps get 4x slower.
    steps = np.arange(1.0, 301.0)
    step_time = np.where(steps > 200, 0.2, 0.05)
    timing = {"step": steps, "step_time": step_time}
    timing |= {"phase_data_s": 0.35 * step_time, "phase_optimizer_s": 0.55 * step_time}
    adam = OptimizerRecord(0, "Adam", "cpu", "for-loop", can_fuse=True, can_foreach=True)
    health = Health()
    # Slower for 50 s from step 260.
    for n, when in ((60, 0.0), (100, 1.0), (160, 2.0), (200, 3.0), (260, 10.0), (300, 60.0)):
        cut = {k: v[:n] for k, v in timing.items()}
        alerts += health.check(HealthInput(n, when, cut, optimizer=adam))
    # Fine-tuning: adapters that never move, adapters that move far too little a step.
    alerts += Health().check(stuck(60))
    alerts += Health().check(too_slow(60))
    # Fine-tuning setup: adapters missing from the optimizer, a base stepped beside them.
    missing = lora_adapters(in_optimizer=False)
    alerts += Health().check(dataclasses.replace(healthy(40), adapters=missing))
    stepped = dataclasses.replace(
        lora_adapters(), base_stepped=("l0.base.weight",), base_stepped_count=1,
        base_stepped_numel=4096, wrapped_trainable=("l0.base.weight",),
    )  # fmt: skip
    alerts += Health().check(dataclasses.replace(healthy(40), adapters=stepped))
    # The structural causes: one input each, with what the training side would have read.
    for inp in structure_cases.inputs():
        alerts += Health().check(inp)
    alerts.append(non_finite_gradients(5, 0.0, ["fc1.weight"]))
    alerts.append(non_finite_gradients(5, 0.0, []))
    # The causes judged from the numbers: the lr and its schedule, labels, weight decay.
    for inp in (
        causes_data.schedule_per_batch(),
        causes_data.lr_high(),
        causes_data.lr_low(),
        causes_data.labels(),
        causes_data.weight_decay(),
    ):
        alerts += Health().check(inp)
    return alerts


def straggling() -> RankColumns:
    """Two ranks of a DDP job: equal step times, rank 1 waiting 50 ms longer for its batch."""
    n = 120  # held for over PERSIST_STEPS
    wait = np.vstack([np.full(n, 0.001), np.full(n, 0.051)])
    return RankColumns((0, 1), ("a", "b"), np.arange(1.0, n + 1), np.full((2, n), 0.06), wait)


def replicated() -> RankColumns:
    """Two ranks of a DDP job fed the same batches: the same loss on every step."""
    n = 30
    loss = np.tile(2.0 / np.arange(1.0, n + 1), (2, 1))
    steps = np.arange(1.0, n + 1)
    return RankColumns((0, 1), ("a", "b"), steps, np.full((2, n), 0.06), None, loss)


def stalled() -> RankColumns:
    """Two ranks, no step for 60 s: rank 0 waits in backward, rank 1 is in its data phase."""
    n = 30
    progress = RankProgress(
        seen=np.array([160.0, 160.0]),
        step=np.array([30.0, 30.0]),
        phase=np.array([2.0, 0.0]),
        step_end=np.array([100.0, 100.0]),
        status=("running", "running"),
        pids=(11, 12),
    )
    steps = np.arange(1.0, n + 1)
    return RankColumns((0, 1), ("a", "b"), steps, np.full((2, n), 0.06), progress=progress)


def unsynced() -> RankColumns:
    """Two ranks whose gradients are never all-reduced: their grad norms differ every step."""
    n = 30
    grads = np.vstack([np.full(n, 2.0), np.full(n, 3.0)])
    steps = np.arange(1.0, n + 1)
    return RankColumns((0, 1), ("a", "b"), steps, np.full((2, n), 0.06), grad_norm=grads)


def flat() -> HealthInput:
    run = Run()
    run.add(40, loss=2.0)
    return run.input()


def test_every_rule_raises_alerts_whose_subject_is_data() -> None:
    alerts = every_alert()
    raised = {a.rule for a in alerts}
    registered = {factory(Thresholds()).name for factory in RULES}
    assert registered <= raised, registered - raised
    for alert in alerts:
        assert is_subject(alert.subject), alert
        if alert.subject == LAYERS_SUBJECT:
            assert alert.layers, alert
    by_rule = {(a.rule, a.subject) for a in alerts}
    assert ("loss_spike", LOSS) in by_rule and ("loss_non_finite", LOSS) in by_rule
    assert ("exploding_gradients", GRAD_NORM) in by_rule
    assert ("exploding_gradients", LAYERS_SUBJECT) in by_rule
    assert {("gpu_temperature", "gpu0"), ("gpu_throttling", "gpu0"), ("gpu_idle", "gpu0")} <= (
        by_rule
    )
    assert {("device_memory", "gpu1"), ("device_memory", "mps")} <= by_rule
    assert ("grad_non_finite", GRAD_NORM) in by_rule
    assert ("straggler", "rank1") in by_rule
    assert {("same_batches", "rank0"), ("rank_stalled", "rank1")} <= by_rule
    assert ("rank_divergence", "rank0") in by_rule
    assert {("memory_peak", "gpu0"), ("alloc_retries", "gpu0"), ("memory_leak", "gpu0")} <= (
        by_rule
    )


def test_nothing_in_health_reads_an_alert_message() -> None:
    # The subject is data so that no code parses wording: no `.message` is read, and no
    # regular expression is applied, anywhere in the package except to metric keys. Only
    # explain.py reads it, to hand it to people as it is (an explanation shows the line).
    package = Path(nbmonitor.health.__file__).parent
    readers, regexes = [], []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "message"
                and isinstance(node.ctx, ast.Load)
            ):
                readers.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id == "re":
                    regexes.append(f"{path.name}:{node.lineno}")
    assert {r.partition(":")[0] for r in readers} <= {"explain.py"}
    # One: _GPU_KEY over metric keys (gpu0_util_percent), in devices.py.
    assert [r.partition(":")[0] for r in regexes] == ["devices.py"]
