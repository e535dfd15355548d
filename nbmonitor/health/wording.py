"""How alert messages write numbers, layers and name lists, shared by every rule and the
static checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nbmonitor._names import MAX_NAMED, name_list

# The healthy size of one optimizer update relative to its weights, quoted by both
# update-ratio rules.
HEALTHY_UPDATE = "healthy is about 1e-3"

# Module kinds whose outputs saturate: deep stacks of them starve the first layers of gradient.
SATURATING = frozenset({"Sigmoid", "Tanh", "Hardsigmoid", "Hardtanh", "Softsign", "LogSigmoid"})


def num(value: float) -> str:
    """Two significant digits, in scientific notation outside [0.01, 1000)."""
    return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"


def label(name: str, kinds: Mapping[str, str] | None = None) -> str:
    """A module or parameter name as a message writes it: a layer of a ``Sequential`` is
    ``layer 3 (Linear)``, not a bare ``3``; a parameter of one is ``3.weight (Linear)``."""
    kinds = kinds or {}
    module = name.rpartition(".")[0]
    if name in kinds or not module:  # a module (or a top-level name)
        kind = kinds.get(name)
        last = name.rpartition(".")[2]
        if not last.isdigit():
            return name
        text = f"layer {name}" if "." not in name else name
        return f"{text} ({kind})" if kind else text
    kind = kinds.get(module)
    if kind and module.rpartition(".")[2].isdigit():
        return f"{name} ({kind})"
    return name


def layer_list(names: Sequence[str], kinds: Mapping[str, str] | None = None) -> str:
    """``name_list`` of ``label``-led names."""
    return name_list([label(name, kinds) for name in names])


def kinds_of(names: Sequence[str], kinds: Mapping[str, str] | None) -> set[str]:
    """The kinds of the modules ``names`` are (or whose parameters they are)."""
    kinds = kinds or {}
    found: set[str] = set()
    for name in names:
        kind = kinds.get(name) or kinds.get(name.rpartition(".")[0])
        if kind:
            found.add(kind)
    return found


__all__ = [
    "HEALTHY_UPDATE",
    "MAX_NAMED",
    "SATURATING",
    "kinds_of",
    "label",
    "layer_list",
    "name_list",
    "num",
]
