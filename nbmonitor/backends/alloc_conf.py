"""The caching allocator's settings in effect, from the environment (read once, at attach).

PyTorch's CUDA allocator reads one variable: ``PYTORCH_CUDA_ALLOC_CONF`` when set, else
``PYTORCH_ALLOC_CONF`` (its newer, device-generic name); the other is then ignored. Its text
is comma-separated ``key:value`` options, where a value may be a bracketed list
(``roundup_power2_divisions:[64:8,>:1]``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # the first one set is used
# The most of a variable kept (it is the user's text, written to meta.json).
MAX_CHARS = 1000


def _split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def alloc_conf(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """``{"variable": the one in effect or None, "text": its value, "options": {key: value},
    "expandable_segments": bool}``."""
    env = os.environ if environ is None else environ
    variable = next((name for name in VARIABLES if env.get(name) is not None), None)
    text = env[variable][:MAX_CHARS] if variable is not None else None
    options: dict[str, str] = {}
    for part in _split(text or ""):
        key, sep, value = part.partition(":")
        if sep and key.strip():
            options[key.strip()] = value.strip()
    return {
        "variable": variable,
        "text": text,
        "options": options,
        "expandable_segments": options.get("expandable_segments", "").lower() == "true",
    }
