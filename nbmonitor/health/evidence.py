"""Evidence: the values, steps and layers an alert was judged on, as small JSON-able data.

An alert's ``evidence`` is written to the run log and read back from folders nobody vouches
for, so one function bounds it on the way in (``bounded``), whoever built it: a rule (numpy
scalars and arrays become numbers and lists) or a record of ``events.jsonl`` (anything a
hostile file can hold). What comes out is plain JSON data: ``None``, ``bool``, ``int``,
``float`` (NaN and infinities kept: a non-finite loss is evidence), ``str``, ``list`` and
``dict`` with ``str`` keys, within the bounds below.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Union

import numpy as np

# Evidence is a summary (a few numbers, steps and names), not a copy of the data: the bounds
# keep one alert's record a few KiB however it was built.
MAX_KEYS = 32  # entries of a mapping kept (the first ones)
MAX_ITEMS = 32  # items of a list kept (the first ones)
MAX_TEXT = 200  # characters of a string or a key kept
MAX_DEPTH = 5  # nesting kept: deeper values become their ``repr``, cut to MAX_TEXT
MAX_INT = 2**53  # larger integers are kept as floats (what JSON readers hold exactly)

EvidenceValue = Union[  # noqa: UP007 (a recursive alias: the string form needs Union)
    None, bool, int, float, str, list["EvidenceValue"], dict[str, "EvidenceValue"]
]
Evidence = dict[str, EvidenceValue]


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters (the last one an ellipsis when it was longer)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bounded(value: object, depth: int = 0) -> EvidenceValue:
    """``value`` as bounded JSON data (see the module docstring). Never raises."""
    if value is None or isinstance(value, bool | str):
        return cut(value) if isinstance(value, str) else value
    if isinstance(value, np.generic):
        value = value.item()
        if not isinstance(value, bool | int | float | str):
            return cut(repr(value))
        return bounded(value, depth)
    if isinstance(value, int):
        return value if -MAX_INT <= value <= MAX_INT else float(value)
    if isinstance(value, float):
        return value
    if depth >= MAX_DEPTH:
        return cut(_repr(value))
    if isinstance(value, Mapping):
        out: Evidence = {}
        for key, item in value.items():
            if len(out) >= MAX_KEYS:
                break
            out[cut(key if isinstance(key, str) else _repr(key))] = bounded(item, depth + 1)
        return out
    if isinstance(value, set | frozenset):
        value = sorted(value, key=_repr)  # a set's order changes from run to run
    if isinstance(value, np.ndarray):
        return [bounded(v, depth + 1) for v in value.ravel()[:MAX_ITEMS].tolist()]
    if isinstance(value, list | tuple | range | Iterable) and not isinstance(value, bytes):
        items: list[EvidenceValue] = []
        try:
            for item in value:
                if len(items) >= MAX_ITEMS:
                    break
                items.append(bounded(item, depth + 1))
        except Exception:
            return cut(_repr(value))
        return items
    return cut(_repr(value))


def evidence_of(value: object) -> Evidence:
    """``value`` as an alert's evidence: a bounded mapping (``{}`` for anything that is not
    a mapping). Never raises."""
    if not isinstance(value, Mapping):
        return {}
    out = bounded(value)
    return out if isinstance(out, dict) else {}


def text(value: EvidenceValue) -> str:
    """One evidence value as a message writes it: numbers with two significant digits,
    lists joined with ``, `` (at most 5 shown)."""
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "n/a"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        shown = ", ".join(text(v) for v in value[:5])
        return shown + (f" and {len(value) - 5} more" if len(value) > 5 else "")
    return ", ".join(f"{k} {text(v)}" for k, v in list(value.items())[:5])


def _repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_KEYS",
    "MAX_TEXT",
    "Evidence",
    "EvidenceValue",
    "bounded",
    "cut",
    "evidence_of",
    "text",
]
