"""The one binary codec of the widget traits: an array travels as ``{view, dtype, shape}``.

``view`` is the raw little-endian bytes, which ipywidgets (and marimo's anywidget bridge) lift
out of the JSON into a binary buffer wherever it sits in a trait's value; ``js/src/codec.js``
turns it back into a typed array without copying. Only float32 (chart values: a chart cannot
show more precision, and it halves the bytes) and float64 (step numbers past 2**24) are used.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

DTYPES = ("float32", "float64")


class Encoded(TypedDict):
    view: bytes
    dtype: str
    shape: list[int]


def encode(array: npt.ArrayLike, dtype: str = "float32") -> Encoded:
    """``array`` as ``{view, dtype, shape}`` (C order, little-endian)."""
    if dtype not in DTYPES:
        raise ValueError(f"nbmonitor: the codec carries {DTYPES}, not {dtype!r}")
    a = np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"view": a.tobytes(), "dtype": dtype, "shape": [int(n) for n in a.shape]}


def decode(value: Encoded | dict[str, Any]) -> npt.NDArray[Any]:
    """The array an ``encode`` carried (for tests and the static fallback)."""
    dtype = str(value["dtype"])
    if dtype not in DTYPES:
        raise ValueError(f"nbmonitor: the codec carries {DTYPES}, not {dtype!r}")
    shape = tuple(int(n) for n in value["shape"])
    return np.frombuffer(bytes(value["view"]), dtype=np.dtype(dtype).newbyteorder("<")).reshape(
        shape
    )
