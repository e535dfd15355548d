"""Checking attach() arguments: one-line errors that say what to do, before anything starts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch

from nbmonitor._hooks import optimizer_parameters
from nbmonitor._layers import GROUPINGS
from nbmonitor.health import Thresholds

ON_NAN = ("warn", "raise")


def json_safe(value: object) -> object:
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


def check_attach_args(
    model: object,
    optimizer: object,
    interval: object,
    total_steps: object,
    name: object,
) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"nbmonitor.attach: model must be a torch.nn.Module, got {type(model).__name__}; "
            "call attach(model, optimizer)."
        )
    if optimizer is not None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "nbmonitor.attach: optimizer must be a torch.optim.Optimizer or None, got "
                f"{type(optimizer).__name__}; pass the optimizer you call .step() on."
            )
        model_params = {id(p) for p in model.parameters()}
        if model_params and not any(id(p) in model_params for p in optimizer_parameters(optimizer)):
            raise ValueError(
                "nbmonitor.attach: the optimizer holds none of the model's parameters; "
                "build it from model.parameters() or pass the matching model."
            )
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not math.isfinite(interval)
        or interval <= 0
    ):
        raise ValueError(
            f"nbmonitor.attach: interval must be a number of seconds > 0, got {interval!r}; "
            "e.g. interval=0.5."
        )
    if total_steps is not None and (
        isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps <= 0
    ):
        raise ValueError(
            f"nbmonitor.attach: total_steps must be a positive int or None, got {total_steps!r}."
        )
    if name is not None and not isinstance(name, str):
        raise TypeError(f"nbmonitor.attach: name must be a str or None, got {type(name).__name__}.")


def check_layer_args(layer_every: object, layer_group: object, on_nan: object) -> None:
    if isinstance(layer_every, bool) or not isinstance(layer_every, int) or layer_every < 0:
        raise ValueError(
            f"nbmonitor.attach: layer_every must be an int >= 0 (0 turns parameter norms and "
            f"update ratios off), got {layer_every!r}."
        )
    if layer_group not in GROUPINGS:
        raise ValueError(
            f"nbmonitor.attach: layer_group must be 'param' or 'module', got {layer_group!r}."
        )
    if on_nan not in ON_NAN:
        raise ValueError(f"nbmonitor.attach: on_nan must be 'warn' or 'raise', got {on_nan!r}.")


def coerce_thresholds(value: object) -> Thresholds:
    if value is None:
        return Thresholds()
    if isinstance(value, Thresholds):
        return value
    if isinstance(value, Mapping):
        try:
            return Thresholds(**value)
        except TypeError as exc:
            known = ", ".join(f.name for f in dataclasses.fields(Thresholds))
            raise ValueError(
                f"nbmonitor.attach: unknown threshold in {sorted(value)}; known: {known}."
            ) from exc
    raise TypeError(
        "nbmonitor.attach: thresholds must be a dict or nbmonitor.Thresholds, got "
        f"{type(value).__name__}."
    )
