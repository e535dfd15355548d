"""What the adapters of a fine-tune are, as plain data: which parameters are adapters (LoRA's
A and B, a DoRA magnitude, an IA3 scale, a prompt, a head trained on purpose), what base they
sit on, whether each trains (``requires_grad``, in the optimizer, its group and learning
rate) and whether it started at zero. Read once at attach (``live/adapters.py``), kept in
meta.json (``to_json``/``from_json``) so a replayed run judges the same, and read by the
fine-tune rules (``rules/finetune.py``) and the "is it training" verdict (``finetune.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# What an adapter tensor is. "A"/"B": the down and up matrices of a low-rank update (B is the
# one initialised to zero, so that training starts from the base model); "magnitude": DoRA's
# per-column scale; "scale": IA3's learned rescaling; "prompt": prompt/prefix tuning's virtual
# tokens; "head": a module trained on purpose beside the adapters (peft's modules_to_save);
# "adapter": any other adapter tensor (a bottleneck adapter, peft's other methods).
ROLES = ("A", "B", "magnitude", "scale", "prompt", "head", "adapter")
# The roles whose tensors are the adapters proper (a head trains on purpose, but it is a copy
# of a base module, not an adapter: its learning does not say the adapters learn).
ADAPTER_ROLES = frozenset({"A", "B", "magnitude", "scale", "prompt", "adapter"})
# At most this many base parameter names are kept (a 7B model has hundreds).
MAX_BASE_NAMES = 64


@dataclass(frozen=True)
class AdapterTensor:
    """One adapter parameter."""

    name: str  # its model.named_parameters() name
    role: str  # one of ROLES
    module: str  # the module it adapts ("" when none: a prompt)
    numel: int
    trainable: bool  # requires_grad
    in_optimizer: bool
    group: int  # its optimizer param group (-1: in none)
    lr: float  # that group's learning rate at attach (a schedule's initial_lr when set); NaN
    zero_start: bool  # all zero at attach (LoRA's B)


@dataclass(frozen=True)
class Adapters:
    """The adapters of one model and the base they sit on."""

    method: str  # "LoRA (peft)", "LoRA", "IA3 (peft)", "prefix tuning (peft)", ...
    tensors: tuple[AdapterTensor, ...]
    base_numel: int  # parameters of the base (everything not an adapter nor a head)
    base_trainable_numel: int  # of which require grad
    # Base parameters that require grad and that the optimizer holds (stepped), and those that
    # require grad but that it lacks (gradients computed, never applied); names capped at
    # MAX_BASE_NAMES, counts whole.
    base_stepped: tuple[str, ...] = ()
    base_stepped_count: int = 0
    base_stepped_numel: int = 0
    base_unstepped: tuple[str, ...] = ()
    base_unstepped_count: int = 0
    # Base weights an adapter wraps (LoRA's base_layer.weight) that require grad: training them
    # beside their own low-rank update is never what a LoRA setup means.
    wrapped_trainable: tuple[str, ...] = ()
    # Whether the optimizer was known at attach (without it, "in the optimizer" is not known:
    # an optimizer adopted at its first step holds what it holds).
    optimizer_known: bool = True

    @property
    def adapters(self) -> tuple[AdapterTensor, ...]:
        """The adapter tensors proper (no heads)."""
        return tuple(t for t in self.tensors if t.role in ADAPTER_ROLES)

    @property
    def heads(self) -> tuple[AdapterTensor, ...]:
        return tuple(t for t in self.tensors if t.role == "head")

    @property
    def training(self) -> tuple[AdapterTensor, ...]:
        """The adapters that can train: they require grad and the optimizer holds them."""
        known = self.optimizer_known
        return tuple(t for t in self.adapters if t.trainable and (t.in_optimizer or not known))

    @property
    def starts_at_zero(self) -> frozenset[str]:
        """The adapters that were all zero at attach (LoRA's B): their ||Δw||/||w|| is about
        1/step by design as they grow from nothing, never a sign of too large a step."""
        names = [t.name for t in self.tensors if t.zero_start]
        # With layer_group="module" a layer is the module (peft's lora_B.default holds only B).
        return frozenset(names + [n.rsplit(".", 1)[0] for n in names if "." in n])

    @property
    def adapter_numel(self) -> int:
        return sum(t.numel for t in self.adapters)

    def count(self, tensors: Sequence[AdapterTensor] | None = None) -> str:
        """``24 LoRA matrices``, ``6 IA3 scales``, ``1 prompt``, ``4 adapter tensors``."""
        tensors = self.adapters if tensors is None else tensors
        roles = {t.role for t in tensors}
        n = len(tensors)
        if roles <= {"A", "B"}:
            what = "LoRA matrix" if n == 1 else "LoRA matrices"
        elif roles <= {"A", "B", "magnitude"}:
            what = "DoRA tensor" if n == 1 else "DoRA tensors"
        elif roles == {"scale"}:
            what = "IA3 scale" if n == 1 else "IA3 scales"
        elif roles == {"prompt"}:
            what = "prompt" if n == 1 else "prompts"
        else:
            what = "adapter tensor" if n == 1 else "adapter tensors"
        return f"{n} {what}"

    # -- meta.json ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "tensors": [
                {
                    "name": t.name,
                    "role": t.role,
                    "module": t.module,
                    "numel": t.numel,
                    "trainable": t.trainable,
                    "in_optimizer": t.in_optimizer,
                    "group": t.group,
                    "lr": t.lr if math.isfinite(t.lr) else None,
                    "zero_start": t.zero_start,
                }
                for t in self.tensors
            ],
            "base_numel": self.base_numel,
            "base_trainable_numel": self.base_trainable_numel,
            "base_stepped": list(self.base_stepped),
            "base_stepped_count": self.base_stepped_count,
            "base_stepped_numel": self.base_stepped_numel,
            "base_unstepped": list(self.base_unstepped),
            "base_unstepped_count": self.base_unstepped_count,
            "wrapped_trainable": list(self.wrapped_trainable),
            "optimizer_known": self.optimizer_known,
        }

    @classmethod
    def from_json(cls, data: object, limit: int = 100_000) -> Adapters | None:
        """The adapters a meta.json wrote (untrusted: anything malformed reads as None; at
        most ``limit`` tensors)."""
        if not isinstance(data, Mapping):
            return None
        try:
            raw = data.get("tensors")
            if not isinstance(raw, list) or len(raw) > limit:
                return None
            tensors = tuple(
                AdapterTensor(
                    name=str(t["name"]),
                    role=str(t["role"]) if t.get("role") in ROLES else "adapter",
                    module=str(t.get("module", "")),
                    numel=int(t.get("numel", 0)),
                    trainable=bool(t.get("trainable", True)),
                    in_optimizer=bool(t.get("in_optimizer", True)),
                    group=int(t.get("group", -1)),
                    lr=float(t["lr"]) if isinstance(t.get("lr"), (int, float)) else math.nan,
                    zero_start=bool(t.get("zero_start", False)),
                )
                for t in raw
                if isinstance(t, Mapping)
            )

            def names(key: str) -> tuple[str, ...]:
                value = data.get(key)
                if not isinstance(value, list):
                    return ()
                return tuple(str(v) for v in value[:MAX_BASE_NAMES])

            return cls(
                method=str(data.get("method", "adapters")),
                tensors=tensors,
                base_numel=int(data.get("base_numel", 0)),
                base_trainable_numel=int(data.get("base_trainable_numel", 0)),
                base_stepped=names("base_stepped"),
                base_stepped_count=int(data.get("base_stepped_count", 0)),
                base_stepped_numel=int(data.get("base_stepped_numel", 0)),
                base_unstepped=names("base_unstepped"),
                base_unstepped_count=int(data.get("base_unstepped_count", 0)),
                wrapped_trainable=names("wrapped_trainable"),
                optimizer_known=bool(data.get("optimizer_known", True)),
            )
        except (KeyError, TypeError, ValueError):
            return None


__all__ = ["ADAPTER_ROLES", "MAX_BASE_NAMES", "ROLES", "AdapterTensor", "Adapters"]
