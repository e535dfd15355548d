"""Everything the training thread runs for one monitor, built from the attach options: the
tracked parameters, the probes, the step clock that calls them, and the recorder they feed."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nbmonitor._capture.clock import StepClock
from nbmonitor._capture.inputs import optimizer_parameters
from nbmonitor._capture.phases import PhaseTimer
from nbmonitor._capture.probes.activations import ActivationsProbe
from nbmonitor._capture.probes.base import Probe
from nbmonitor._capture.probes.flops import FlopsProbe
from nbmonitor._capture.probes.forward_check import ForwardCheckProbe
from nbmonitor._capture.probes.grad_norms import GradNormProbe
from nbmonitor._capture.probes.hf_loss import OutputLossProbe
from nbmonitor._capture.probes.memory import MemoryProbe
from nbmonitor._capture.probes.structure import StructureProbe
from nbmonitor._capture.probes.update_ratio import UpdateRatioProbe
from nbmonitor._capture.recorder import Recorder
from nbmonitor.errors import ErrorLog, Guard


@dataclass
class Capture:
    recorder: Recorder
    clock: StepClock
    params: list[torch.nn.Parameter]  # tracked: the optimizer's, then trainable ones it lacks
    param_names: list[str]
    n_optimized: int
    grad_norms: GradNormProbe
    update_ratio: UpdateRatioProbe | None
    memory: MemoryProbe


def build_capture(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    errors: ErrorLog,
    *,
    layer_every: int,
    memory_every: int,
    activations: bool,
    check_forward: bool,
    on_nan: str,
    flops: bool = False,
    start_step: int = 0,
    phases: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    wall_clock: Callable[[], float] = time.time,
    accumulation: Callable[[], int] | None = None,
) -> Capture:
    names = {id(p): n for n, p in model.named_parameters()}
    params = optimizer_parameters(optimizer) if optimizer is not None else []
    # Trainable parameters the optimizer lacks still count in the total norm, as
    # clip_grad_norm_(model.parameters()) would count them.
    n_optimized = len(params)
    held = {id(p) for p in params}
    params += [p for p in model.parameters() if p.requires_grad and id(p) not in held]
    param_names = [names.get(id(p), f"param{i}") for i, p in enumerate(params)]

    def guard(name: str) -> Guard:
        return Guard(f"probe:{name}", errors)

    raise_non_finite = on_nan == "raise"
    # Order matters: per-forward probes hand over before the output's loss is recorded, and
    # the gradient norms (and their non-finite check) come before the update's copy.
    probes: list[Probe] = []
    if flops:  # first: its count ends before the other probes' work on the output
        probes.append(FlopsProbe(guard("flops"), model))
    if check_forward:
        probes.append(ForwardCheckProbe(guard("check_forward"), model, raise_non_finite))
    if activations:
        probes.append(ActivationsProbe(guard("activations"), model, layer_every))
    probes.append(OutputLossProbe(guard("output_loss")))
    memory = MemoryProbe(guard("memory"), model, memory_every, wall_clock)
    probes.append(memory)
    probes.append(StructureProbe(guard("structure"), model, memory_every))
    grad = GradNormProbe(guard("grad_norms"), params, param_names, raise_non_finite)
    probes.append(grad)
    update = None
    if layer_every and n_optimized:
        update = UpdateRatioProbe(
            guard("update_ratio"), params[:n_optimized], param_names[:n_optimized], layer_every
        )
        probes.append(update)
    recorder = Recorder()
    # CUDA events time the device's phases; elsewhere the host clock does.
    first = next(iter(model.parameters()), None)
    cuda = first is not None and first.is_cuda
    timer = PhaseTimer(guard("phases"), clock, cuda=cuda, enabled=phases)
    step_clock = StepClock(
        model,
        optimizer,
        recorder,
        errors,
        probes,
        phases=timer,
        keep_forward_pre=activations or phases,  # every forward's start is a phase mark
        start_step=start_step,
        clock=clock,
        wall_clock=wall_clock,
        accumulation=accumulation,
    )
    clock_ref = weakref.ref(step_clock)  # the model's hooks hold the clock, which holds this

    def clock_optimizer() -> torch.optim.Optimizer | None:
        held = clock_ref()
        return held.optimizer if held is not None else None

    memory.bind(clock_optimizer)
    return Capture(recorder, step_clock, params, param_names, n_optimized, grad, update, memory)
