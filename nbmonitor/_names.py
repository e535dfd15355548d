"""How a message lists names ("a, b, c and 4 more"): shared by the health rules (sampler) and
the errors the training thread raises (``on_nan="raise"``), which may not import each other."""

from __future__ import annotations

from collections.abc import Sequence

MAX_NAMED = 5  # names listed in a message before "and N more"; Alert.layers keeps them all


def name_list(names: Sequence[str], limit: int = MAX_NAMED) -> str:
    """``"a, b, c and 4 more"``: how every message lists layers or parameters."""
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f" and {len(names) - limit} more"
    return shown
