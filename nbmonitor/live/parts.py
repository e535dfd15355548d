"""The parts the live composition root (``monitor.py``) builds from torch objects: the run's
meta.json and the per-layer statistics of the tracked parameters."""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import socket
import sys
from collections.abc import Mapping

import torch

from nbmonitor._capture.inputs import optimizer_parameters
from nbmonitor._capture.probes.grad_norms import grad_norms, norm_dtype
from nbmonitor._engine.assemble.layers import LayerStats, ParamInfo
from nbmonitor._version import __version__
from nbmonitor.backends.alloc_conf import alloc_conf
from nbmonitor.backends.base import Backend
from nbmonitor.backends.selection import model_device_type
from nbmonitor.live.redact import redact_argv
from nbmonitor.options import Options


def json_safe(value: object) -> object:
    """``value`` as JSON can hold it: non-finite floats and anything else as text, a
    one-element tensor as its number (an optimizer's defaults, read once at attach)."""
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().cpu())
    return repr(value)


def run_meta(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    options: Options,
    backend: Backend,
    start: float,
) -> dict[str, object]:
    """What meta.json says about a live run when it starts."""
    params = list(model.parameters())
    opt_meta: object = None
    if optimizer is not None:
        opt_meta = {
            "class": type(optimizer).__qualname__,
            "param_groups": len(optimizer.param_groups),
            "defaults": json_safe(optimizer.defaults),
        }
    attach = options.as_meta()
    # The rules' thresholds in force, every field (defaults included): a reopened run's alerts
    # are read against them.
    thresholds = attach.pop("thresholds")
    return {
        "model": {
            "class": type(model).__qualname__,
            "module": type(model).__module__,
            "parameters": sum(p.numel() for p in params),
            "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
            "device": model_device_type(model),
        },
        "optimizer": opt_meta,
        # device_index: whose energy counter a replay reads for the energy per step.
        "backend": {
            "name": backend.name,
            "devices": list(backend.devices),
            "device_index": backend.device_index,
        },
        "versions": {
            "nbmonitor": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "pid": os.getpid(),
        "argv": redact_argv(sys.argv),  # no credentials on disk
        "start_time": _dt.datetime.fromtimestamp(start, _dt.UTC).isoformat(),
        "start_timestamp": start,
        "attach": attach,
        "thresholds": thresholds,
        "allocator": alloc_conf(),
    }


def layer_stats(
    params: list[torch.nn.Parameter],
    names: list[str],
    optimizer: torch.optim.Optimizer | None,
    group_by: str,
) -> LayerStats:
    in_opt = {id(p) for p in optimizer_parameters(optimizer)} if optimizer else set()
    layers = LayerStats(
        [
            ParamInfo(
                name=n,
                shape=tuple(p.shape),
                numel=p.numel(),
                dtype=str(p.dtype).removeprefix("torch."),
                device=str(p.device),
                requires_grad=p.requires_grad,
                in_optimizer=id(p) in in_opt,
            )
            for n, p in zip(names, params, strict=True)
        ],
        group_by=group_by,
    )
    if params:
        # Known from the start so that vanishing gradients (grad norm relative to the
        # parameter norm) can be judged before the first update-ratio step. One wait, at
        # attach, never in the loop.
        norms = grad_norms([p.detach() for p in params], norm_dtype(params))
        norms.wait()
        layers.set_param_norms(norms.values())
    return layers
