"""Writing runs for the runs/ and sinks/ tests, and an independent reference reader."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import numpy.typing as npt

from nbmonitor.sinks import RunLogSink


def make_log(tmp_path: pathlib.Path, name: str | None = "test") -> RunLogSink:
    return RunLogSink.create(tmp_path / "runs", name, {"model": "MLP", "parameters": 123})


def reference_columns(path: pathlib.Path) -> dict[str, npt.NDArray[np.float64]]:
    """The plain-Python recipe of docs/file-format.md, as columns: what the fast reader must
    return, whatever sidecar it used."""
    records = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                records.append(json.loads(line))
            except ValueError:
                break
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r))
    return {
        k: np.array(
            [v if isinstance(v := r.get(k), (int, float)) else math.nan for r in records],
            dtype=np.float64,
        )
        for k in keys
    }


def assert_same_columns(
    got: dict[str, npt.NDArray[np.float64]], want: dict[str, npt.NDArray[np.float64]]
) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == np.float64
        # bit-for-bit, NaN included (-0.0 and NaN compare by their bytes)
        assert got[k].tobytes() == want[k].tobytes(), k
