"""Every probe meets the Probe protocol, acts only at the moments it declares, and sits behind
its own Guard: a probe that keeps failing is switched off while the step clock goes on."""

from __future__ import annotations

import pytest
import torch
from tests.helpers import mlp

from nbmonitor._capture.capture import build_capture
from nbmonitor._capture.probes.base import EVENTS, Probe, ProbeBase
from nbmonitor.errors import MAX_FAILURES_IN_A_ROW, ErrorLog


def every_probe() -> tuple[torch.nn.Module, torch.optim.Optimizer, list[Probe], ErrorLog]:
    model = mlp(width=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    errors = ErrorLog()
    capture = build_capture(
        model,
        opt,
        errors,
        layer_every=1,
        memory_every=1,
        activations=True,
        check_forward=True,
        on_nan="warn",
        flops=True,
    )
    return model, opt, list(capture.clock.probes), errors


def test_every_probe_meets_the_protocol() -> None:
    model, _, probes, _ = every_probe()
    names = [p.name for p in probes]
    assert len(set(names)) == len(names)
    assert set(names) == {
        "flops",
        "check_forward",
        "activations",
        "output_loss",
        "grad_norms",
        "update_ratio",
        "memory",
        "structure",
    }
    for probe in probes:
        assert isinstance(probe, ProbeBase)
        assert probe.guard.name == f"probe:{probe.name}" and probe.guard.on
        assert set(probe.events()) <= set(EVENTS)
        handles = probe.install(model)
        assert isinstance(handles, list)
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize(
    "name",
    [
        "flops",
        "check_forward",
        "activations",
        "output_loss",
        "grad_norms",
        "update_ratio",
        "memory",
        "structure",
    ],
)
def test_a_failing_probe_is_switched_off_and_the_clock_goes_on(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, probes, _ = every_probe()
    kind = type(next(p for p in probes if p.name == name))

    def broken(*args: object) -> None:
        raise RuntimeError(f"{name} broke")

    for event in kind.events(next(p for p in probes if p.name == name)):
        monkeypatch.setattr(kind, event, broken)
    model = mlp(width=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    errors = ErrorLog()
    capture = build_capture(
        model,
        opt,
        errors,
        layer_every=1,
        memory_every=1,
        activations=True,
        check_forward=True,
        on_nan="warn",
        flops=True,
    )
    probe = next(p for p in capture.clock.probes if p.name == name)
    capture.clock.install()
    try:
        for _ in range(MAX_FAILURES_IN_A_ROW + 3):
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        capture.clock.remove()
    assert capture.clock.step == MAX_FAILURES_IN_A_ROW + 3  # every step still counted
    assert errors.counts == {f"probe:{name}": MAX_FAILURES_IN_A_ROW}
    assert not probe.guard.on
    assert len(capture.recorder.drain()) > 0
