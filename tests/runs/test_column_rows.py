"""Rows held as columns (``runs/column_rows.py``) are the rows they stand for: each row the dict
it would have been (keys, order, values; a key absent from the first rows), slices and parts of
them too; the run log's encoder writes the same bytes and sidecar columns from them as from
the rows; the writer process's pickling carries them as columns."""

from __future__ import annotations

import math
import pickle
import pickletools
import random

import numpy as np
import pytest

from nbmonitor.runs.column_rows import ColumnRows, RowParts, row_parts
from nbmonitor.runs.decode import Columns, to_columns
from nbmonitor.runs.encode import LineEncoder
from nbmonitor.runs.format import encode_lines
from nbmonitor.sinks import writer

ODD = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, 5e-324, 2.0**60, 0.1)
KEYS = ("step", "loss", 'we"ird', "pct%d", "financial", "loss_smooth")


def same_columns(a: Columns, b: Columns) -> None:
    assert (a.rows, a.order) == (b.rows, b.order)
    assert a.dense.keys() == b.dense.keys() and a.sparse.keys() == b.sparse.keys()
    for key in a.dense:
        assert a.dense[key].tobytes() == b.dense[key].tobytes(), key
    for key in a.sparse:
        assert a.sparse[key][0].tobytes() == b.sparse[key][0].tobytes(), key
        assert a.sparse[key][1].tobytes() == b.sparse[key][1].tobytes(), key


def random_rows(rng: random.Random) -> tuple[ColumnRows, list[dict[str, float]]]:
    n = rng.randint(1, 120)
    keys = rng.sample(KEYS, rng.randint(1, len(KEYS)))
    columns = {
        k: [rng.choice(ODD) if rng.random() < 0.2 else rng.uniform(-1e6, 1e6) for _ in range(n)]
        for k in keys
    }
    absent = {k: rng.randint(0, n) for k in keys if rng.random() < 0.3}
    rows = [
        {k: column[i] for k, column in columns.items() if i >= absent.get(k, 0)} for i in range(n)
    ]
    return ColumnRows(columns, absent), rows


@pytest.mark.parametrize("seed", range(30))
def test_rows_held_as_columns_are_the_rows_they_stand_for(seed: int) -> None:
    rng = random.Random(seed)
    held, rows = random_rows(rng)
    assert len(held) == len(rows) and list(held) == rows and held == rows and rows == held
    for i in range(-len(rows), len(rows)):
        assert held[i] == rows[i] and list(held[i]) == list(rows[i])  # the keys' order too
    a, b = sorted(rng.randint(0, len(rows)) for _ in range(2))
    assert held[a:b] == rows[a:b] and isinstance(held[a:b], ColumnRows)
    assert held[::3] == rows[::3] and held[-5:] == rows[-5:]
    parts = RowParts([held[:a], rows[a:b], held[b:]])
    assert list(parts) == rows and len(parts) == len(rows) and parts[a:b] == rows[a:b]
    assert [parts[i] for i in range(len(rows))] == rows
    assert row_parts(parts) == [p for p in (held[:a], rows[a:b], held[b:]) if p]
    with pytest.raises(IndexError):
        held[len(rows)]


@pytest.mark.parametrize("seed", range(30))
def test_the_run_log_encodes_rows_held_as_columns_to_the_same_bytes_and_columns(
    seed: int,
) -> None:
    rng = random.Random(seed)
    held, rows = random_rows(rng)
    pauses: list[int] = []
    for every in (1, 7, 32):
        by_columns, by_rows = LineEncoder(), LineEncoder()
        for _ in range(2):  # the first time and with the key sets' templates made
            data, columns = by_columns.encode(
                held, columns=True, pause=lambda: pauses.append(1), every=every
            )
            assert data == by_rows.encode(rows)[0] == encode_lines(rows)
            assert columns is not None
            same_columns(columns, to_columns(rows))
    assert pauses  # sliced as rows are, for the training thread to take the GIL
    a = rng.randint(0, len(rows))
    parts = RowParts([held[:a], rows[a:]])
    data, columns = LineEncoder().encode(parts, columns=True)
    assert data == encode_lines(rows) and columns is not None
    same_columns(columns, to_columns(rows))


def test_values_that_are_not_floats_go_the_json_encoders_way() -> None:
    held = ColumnRows({"step": [1.0, 2.0], "epoch": [1, 2], "x": [np.float64(0.5), 1.0]})
    rows = list(held)
    data, columns = LineEncoder().encode(held, columns=True)
    assert data == encode_lines(rows) and columns is not None
    same_columns(columns, to_columns(rows))


def test_the_writer_process_is_sent_the_columns_smaller_than_the_rows() -> None:
    n = 1000
    columns = {k: [i * 0.001 + len(k) for i in range(n)] for k in KEYS}
    held = ColumnRows(columns, {"loss_smooth": 3})
    sent = writer.dumps(("write", {"steps": held}))
    got = writer.loads(sent)  # the child's unpickler loads it (nbmonitor.runs only)
    assert isinstance(got, tuple) and isinstance(got[1]["steps"], ColumnRows)
    assert got[1]["steps"] == held and got[1]["steps"].absent == {"loss_smooth": 3}
    as_rows = writer.dumps(("write", {"steps": list(held)}))
    assert dicts(sent) < 5 and dicts(as_rows) > n  # no dict, no key repeated, per row
    assert len(sent) < len(as_rows)
    assert pickle.loads(pickle.dumps(held)) == held


def dicts(pickled: bytes) -> int:
    return sum(op.name == "EMPTY_DICT" for op, _, _ in pickletools.genops(pickled))


def test_columns_of_different_lengths_or_absent_keys_it_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match="lengths"):
        ColumnRows({"a": [1.0], "b": []})
    with pytest.raises(ValueError, match="absent"):
        ColumnRows({"a": [1.0]}, {"b": 1})
    assert ColumnRows.joined([ColumnRows({"a": [1.0]}), ColumnRows({"b": [1.0]})]) is None
    first = ColumnRows({"a": [1.0, 2.0], "s": [math.nan, 1.0]}, {"s": 1})
    joined = ColumnRows.joined([first, ColumnRows({"a": [3.0], "s": [2.0]})])
    assert joined is not None and list(joined) == [*first, {"a": 3.0, "s": 2.0}]
    assert ColumnRows.joined([ColumnRows({"a": [3.0], "s": [2.0]}), first]) is None
