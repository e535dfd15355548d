"""How alert messages write numbers and lists, shared by every rule and the static checks."""

from __future__ import annotations

from nbmonitor._names import MAX_NAMED, name_list

# The healthy size of one optimizer update relative to its weights, quoted by both
# update-ratio rules.
HEALTHY_UPDATE = "healthy is about 1e-3"


def num(value: float) -> str:
    """Two significant digits, in scientific notation outside [0.01, 1000)."""
    return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"


__all__ = ["HEALTHY_UPDATE", "MAX_NAMED", "name_list", "num"]
