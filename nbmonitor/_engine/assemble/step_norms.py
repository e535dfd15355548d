"""Per-parameter gradient norms of many steps, unpacked in one numpy pass (sampler thread only).

Both ways of reading steps (record by record, and runs of alike steps as columns) read the
norms here, so that a step's ``grad_norm`` and its per-layer norms are the same numbers
whichever way its records were read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from nbmonitor.records import NormLayout, StepRecord, squared_norms, squared_norms_split


@dataclass(frozen=True, slots=True)
class LayerNorms:
    """Per-parameter gradient norms of consecutive steps packed alike, one row per step;
    ``index`` None means every tracked parameter."""

    steps: tuple[int, ...]
    norms: npt.NDArray[np.float64]  # steps x parameters
    index: tuple[int, ...] | None
    finite: npt.NDArray[np.bool_]  # per step: all of its norms are


def packed_alike(a: StepRecord, b: StepRecord) -> bool:
    # The same layout and index mean the same number of values (NormPass packs them, and
    # hands the same two objects to every step: compared by identity first).
    if a.norms_layout is b.norms_layout and a.norm_index is b.norm_index:
        return True
    return a.norms_layout == b.norms_layout and a.norm_index == b.norm_index


def alike_groups(records: Sequence[StepRecord]) -> Iterator[Sequence[StepRecord]]:
    """``records`` (steps with norms, in order) cut into runs of consecutive steps whose values
    are packed alike (the usual tick: one run)."""
    start = 0
    while start < len(records):
        first = records[start]
        end = start + 1
        while end < len(records) and packed_alike(first, records[end]):
            end += 1
        yield records[start:end]
        start = end


def read_norms(records: Sequence[StepRecord]) -> tuple[list[float], LayerNorms]:
    """The total gradient norm of each step and their per-parameter norms, for ``records``
    packed alike (``alike_groups``) that all have norms. Raises if the values cannot be read;
    changes nothing, so that a failure leaves no trace."""
    values = [r.norms for r in records if r.norms is not None]
    first = records[0]
    layout = first.norms_layout
    split = values[0].stack_alike(values) if layout is not None else None
    steps = tuple(record.step for record in records)
    if split is not None and layout is not None:
        return read_matrix(steps, split[0], split[1], layout, first.norm_index)
    matrix = _stacked([v.floats() for v in values])
    return read_matrix(steps, None, matrix, layout, first.norm_index)


def read_matrix(
    steps: tuple[int, ...],
    head: npt.NDArray[np.floating[Any]] | None,
    tail: npt.NDArray[np.floating[Any]] | None,
    layout: NormLayout | None,
    index: tuple[int, ...] | None,
) -> tuple[list[float], LayerNorms]:
    """``read_norms`` of steps whose values are rows of matrices already: ``head`` the squared
    norms a layout puts first (None: the rows of ``tail`` hold them too, or there are none),
    ``tail`` the rest."""
    if layout is None:
        assert tail is not None
        squares = squared_norms(tail, None)
    elif head is not None:
        squares = squared_norms_split(head, tail, layout)
    else:
        assert tail is not None
        squares = squared_norms(tail, layout)
    # The total norm from the per-tensor ones; NaN/Inf in any of them carries through.
    totals: list[float] = np.sqrt(squares.sum(axis=1)).tolist()
    if layout is None:
        assert tail is not None
        norms = tail.astype(np.float64, copy=False)
    else:
        norms = np.sqrt(squares, out=squares)
    finite = np.all(np.isfinite(norms), axis=1, keepdims=True)[:, 0]
    return totals, LayerNorms(steps, norms, index, finite)


def _stacked(rows: list[npt.NDArray[np.floating[Any]]]) -> npt.NDArray[np.floating[Any]]:
    """``np.stack(rows)`` of 1-D rows: one C call, not numpy's Python per row (a tick stacks
    hundreds); rows of different lengths raise, as np.stack does."""
    lengths = set(map(len, rows))
    if len(lengths) != 1:
        raise ValueError("gradient norms of one layout with different lengths")
    return np.concatenate(rows).reshape(len(rows), lengths.pop())
