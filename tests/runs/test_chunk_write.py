"""A sidecar chunk written from a tick's blocks as they are (no concatenation first) holds the
arrays the concatenated columns give, and reads back."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from nbmonitor.runs.decode import concat_columns, to_columns
from nbmonitor.runs.sidecar import write_chunk


def _arrays(path: pathlib.Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.mark.parametrize(
    "ticks",
    [
        # the same keys every tick: written block by block
        [[{"step": float(s), "loss": 1 / (s + 1), "x": np.nan} for s in range(t, t + 7)]
         for t in range(0, 35, 7)],
        # a key now and then (sparse), a key that comes later (NaN before): concatenated first
        [[{"step": float(s), **({"acc": 0.5} if s % 9 == 0 else {})} for s in range(t, t + 7)]
         for t in range(0, 35, 7)] + [[{"step": 35.0, "late": 1.0}]],
    ],
)  # fmt: skip
def test_blocks_make_the_chunk_their_concatenation_makes(
    tmp_path: pathlib.Path, ticks: list[list[dict[str, float]]]
) -> None:
    blocks = [to_columns(rows) for rows in ticks]
    write_chunk(tmp_path / "a", 0, blocks, (0, 100))
    write_chunk(tmp_path / "b", 0, [concat_columns(blocks)], (0, 100))
    got, want = _arrays(tmp_path / "a" / "000000.npz"), _arrays(tmp_path / "b" / "000000.npz")
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name
    data = got["data"]
    assert data.shape[1] == sum(len(rows) for rows in ticks)
    np.testing.assert_array_equal(data[0], [r["step"] for rows in ticks for r in rows])
