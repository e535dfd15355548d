"""Which parameters of a model are adapters, read once at attach from the module tree, the
parameters' flags and the optimizer's groups (``health/adapters.py`` holds the result).

Three ways to know an adapter, most certain first:

- peft's names: a parameter under ``lora_A``/``lora_B``/``lora_embedding_A``/``lora_embedding_B``
  (LoRA), ``lora_magnitude_vector`` (DoRA), ``ia3_l`` (IA3), ``prompt_encoder`` (prompt and
  prefix tuning), ``modules_to_save`` (a head trained on purpose, peft's copy of a base module);
  hand-written LoRA named the same way (``lora_a``, ``lora_down``, ``lora_up``, ...);
- structure: a module (not a container) holding a full-rank weight and two matrices whose
  product has that weight's shape through a rank far below it, one of them zero at attach or
  the pair trainable beside a frozen weight (LoRA written by hand under any names);
- none of those: a small trainable part beside a large frozen base ("trainable part"), which
  only the verdict and the no-movement rule judge (a base partly unfrozen on purpose is not a
  mistake).

One wait at attach (the adapters' norms, to know which start at zero), never in the loop.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nbmonitor.health.adapters import MAX_BASE_NAMES, Adapters, AdapterTensor

# peft's attribute names, and the role of what they hold.
PEFT_PARTS = {
    "lora_A": "A",
    "lora_B": "B",
    "lora_embedding_A": "A",
    "lora_embedding_B": "B",
    "lora_magnitude_vector": "magnitude",
    "ia3_l": "scale",
    "prompt_encoder": "prompt",
    "modules_to_save": "head",
}
# Names hand-written LoRA gives its matrices (lowercased), and their role.
LORA_NAMES = {
    "lora_a": "A",
    "lora_down": "A",
    "lora_b": "B",
    "lora_up": "B",
}
# The generic rule: a trainable part at most this share of the parameters, beside a frozen rest.
TRAINABLE_PART_SHARE = 0.2
# A low-rank pair's rank is at most this share of the smaller side of the weight it adapts.
LOW_RANK_SHARE = 0.5
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def _peft_method(model: nn.Module) -> str | None:
    """peft's name for the model's method ("LORA", "IA3", "PREFIX_TUNING", ...), if peft's."""
    config = getattr(model, "peft_config", None)
    if isinstance(config, dict) and config:
        first = next(iter(config.values()))
        kind = getattr(first, "peft_type", None)
        value = getattr(kind, "value", kind)
        if isinstance(value, str):
            return value
    return None


def _named_role(name: str) -> tuple[str, str] | None:
    """(role, adapted module) from a parameter's name, or None."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1] if len(parts) > 1 else parts):
        role = PEFT_PARTS.get(part) or LORA_NAMES.get(part.lower())
        if role is not None:
            return role, ".".join(parts[:i])
    # A bare parameter named like a LoRA matrix (``self.lora_A = nn.Parameter(...)``).
    last = parts[-1]
    role = LORA_NAMES.get(last.lower())
    if role is not None:
        return role, ".".join(parts[:-1])
    return None


def _structural_pairs(model: nn.Module, names: dict[int, str]) -> dict[str, tuple[str, str]]:
    """Parameters that form a low-rank update beside a full-rank weight of the same module:
    name -> (role, module)."""
    candidates = _low_rank_candidates(model, names)
    zero = _zero([(n, p) for _, pairs in candidates for pair in pairs for n, p in pair[:2]])
    found: dict[str, tuple[str, str]] = {}
    for module_name, pairs in candidates:
        for (pn, p), (qn, q), bases in pairs:
            if pn in found or qn in found:
                continue
            rows, cols = p.shape[0], q.shape[1]
            pair_trains = p.requires_grad and q.requires_grad
            base_frozen = any(not b.requires_grad for b in bases)
            if not (pn in zero or qn in zero or (pair_trains and base_frozen)):
                continue
            # Which is B: the one at zero; else, as nn.Linear writes a weight (out, in),
            # B @ A has the base's shape; as x @ A @ B writes it, A @ B has its transpose.
            p_is_b = pn in zero and qn not in zero
            if not p_is_b and not (qn in zero and pn not in zero):
                p_is_b = any(tuple(b.shape) == (rows, cols) for b in bases)
            a, b_name = (qn, pn) if p_is_b else (pn, qn)
            found[a] = ("A", module_name)
            found[b_name] = ("B", module_name)
    return found


Pair = tuple[tuple[str, torch.Tensor], tuple[str, torch.Tensor], list[torch.Tensor]]


def _low_rank_candidates(model: nn.Module, names: dict[int, str]) -> list[tuple[str, list[Pair]]]:
    """Per module (not a container): the pairs (P, Q) of its 2-D parameters (its own and its
    direct children's) whose product P @ Q has, through a rank far below it, the shape of
    another of them (or its transpose), with those full-rank weights."""
    out: list[tuple[str, list[Pair]]] = []
    for module_name, module in model.named_modules():
        if isinstance(module, CONTAINERS):
            continue
        # The module's own 2-D parameters and its direct children's.
        mats: list[tuple[str, torch.Tensor]] = []
        for _, p in module.named_parameters(recurse=False):
            if p.dim() == 2 and id(p) in names:
                mats.append((names[id(p)], p))
        for _, child in module.named_children():
            for _, p in child.named_parameters(recurse=False):
                if p.dim() == 2 and id(p) in names:
                    mats.append((names[id(p)], p))
        if len(mats) < 3:
            continue
        pairs: list[Pair] = []
        for i, (pn, p) in enumerate(mats):
            for j, (qn, q) in enumerate(mats):
                if i == j or p.shape[1] != q.shape[0]:
                    continue
                r, rows, cols = p.shape[1], p.shape[0], q.shape[1]
                if r > LOW_RANK_SHARE * min(rows, cols):
                    continue
                bases = [
                    b
                    for k, (_, b) in enumerate(mats)
                    if k not in (i, j) and tuple(b.shape) in ((rows, cols), (cols, rows))
                ]
                if bases:
                    pairs.append(((pn, p), (qn, q), bases))
        if pairs:
            out.append((module_name, pairs))
    return out


def _groups(optimizer: torch.optim.Optimizer | None) -> dict[int, tuple[int, float]]:
    """id(param) -> (group index, the group's lr: a schedule's initial_lr when it set one)."""
    out: dict[int, tuple[int, float]] = {}
    if optimizer is None:
        return out
    for g, group in enumerate(optimizer.param_groups):
        lr = group.get("initial_lr", group.get("lr"))
        if isinstance(lr, torch.Tensor):
            lr = float(lr.detach().cpu()) if lr.numel() == 1 else math.nan
        value = float(lr) if isinstance(lr, (int, float)) else math.nan
        for p in group["params"]:
            out.setdefault(id(p), (g, value))
    return out


def _zero(params: list[tuple[str, torch.Tensor]]) -> set[str]:
    """The names of the parameters that are all zero: one reduction each (no copy of the
    tensor) and one wait per device, at attach."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for n, p in params:
        if p.numel() and not p.is_sparse and p.device.type != "meta":
            by_device.setdefault(p.device, []).append((n, p))
    zero: set[str] = set()
    with torch.no_grad():
        for group in by_device.values():
            nonzero = torch.stack([p.detach().any() for _, p in group]).cpu().tolist()
            zero.update(n for (n, _), v in zip(group, nonzero, strict=True) if not v)
    return zero


def find_adapters(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Adapters | None:
    """The adapters of ``model`` and its base, or None when it has none (a model trained whole)."""
    named = [(n, p) for n, p in model.named_parameters()]
    if not named:
        return None
    names = {id(p): n for n, p in named}
    roles: dict[str, tuple[str, str]] = {}
    for n, _ in named:
        got = _named_role(n)
        if got is not None:
            roles[n] = got
    peft = _peft_method(model)
    if roles and all(role == "head" for role, _ in roles.values()):
        roles = {}  # heads trained on purpose, and no adapter: a model trained in part
    if roles:
        # Only LoRA's pairs start at zero on purpose (a head is a copy of a base module).
        zero = _zero([(n, p) for n, p in named if roles.get(n, ("",))[0] in ("A", "B")])
        method = _method_name(peft, roles, by_hand=peft is None)
    else:
        roles = _structural_pairs(model, names)
        if roles:
            zero = _zero([(n, p) for n, p in named if n in roles])
            method = "LoRA"
        else:
            total = sum(p.numel() for _, p in named)
            trainable = sum(p.numel() for _, p in named if p.requires_grad)
            if not 0 < trainable <= TRAINABLE_PART_SHARE * total:
                return None
            roles = {n: ("adapter", n.rpartition(".")[0]) for n, p in named if p.requires_grad}
            zero = set()
            method = "trainable part"
    groups = _groups(optimizer)
    tensors: list[AdapterTensor] = []
    stepped: list[str] = []
    unstepped: list[str] = []
    base_numel = base_trainable = stepped_numel = 0
    for n, p in named:
        got = roles.get(n)
        group, lr = groups.get(id(p), (-1, math.nan))
        if got is not None:
            role, module = got
            tensors.append(
                AdapterTensor(
                    name=n,
                    role=role,
                    module=module,
                    numel=p.numel(),
                    trainable=p.requires_grad,
                    in_optimizer=group >= 0,
                    group=group,
                    lr=lr,
                    zero_start=n in zero,
                )
            )
            continue
        base_numel += p.numel()
        if p.requires_grad:
            base_trainable += p.numel()
            if group >= 0 and lr != 0:
                stepped.append(n)
                stepped_numel += p.numel()
            elif group < 0:
                unstepped.append(n)
            # In a group of lr 0 it is frozen by its learning rate (lr_zero says so).
    modules = {t.module for t in tensors if t.role in ("A", "B", "magnitude") and t.module}
    wrapped = [
        n
        for n in stepped + unstepped
        if n.rpartition(".")[0] in modules or n.rpartition(".")[0].rpartition(".")[0] in modules
    ]
    dims = {n: p.dim() for n, p in named}
    wrapped = [n for n in wrapped if dims[n] >= 2]
    return Adapters(
        method=method,
        tensors=tuple(tensors),
        base_numel=base_numel,
        base_trainable_numel=base_trainable,
        base_stepped=tuple(stepped[:MAX_BASE_NAMES]),
        base_stepped_count=len(stepped),
        base_stepped_numel=stepped_numel,
        base_unstepped=tuple(unstepped[:MAX_BASE_NAMES]),
        base_unstepped_count=len(unstepped),
        wrapped_trainable=tuple(wrapped[:MAX_BASE_NAMES]),
        optimizer_known=optimizer is not None,
    )


def _method_name(peft: str | None, roles: dict[str, tuple[str, str]], by_hand: bool) -> str:
    kinds = {role for role, _ in roles.values()}
    if peft is not None:
        label = {
            "LORA": "LoRA",
            "IA3": "IA3",
            "PREFIX_TUNING": "prefix tuning",
            "PROMPT_TUNING": "prompt tuning",
            "P_TUNING": "p-tuning",
        }.get(peft, peft.replace("_", " ").lower())
        if "magnitude" in kinds and label == "LoRA":
            label = "DoRA"
        return f"{label} (peft)"
    if kinds & {"A", "B"}:
        return "LoRA"
    return "adapters"


__all__ = ["find_adapters"]
