"""Keys logged rarely cost disk and memory in proportion to their values, not steps x keys;
chunks written before sparse keys (every key dense) still read."""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
from tests.runs.runs_helpers import assert_same_columns, make_log, reference_columns

from nbmonitor.runs import Columns, open_run, sidecar

KEYS = 10_000


def _sidecar_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in (path / "columns").rglob("*.npz"))


def test_ten_thousand_keys_logged_once_each(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    for start in range(0, KEYS, 500):  # ticks of 500 steps, each step with a key of its own
        log.write_steps(
            [{"step": float(i), "loss": 1.0 / (i + 1), f"probe_{i}": float(i)}
             for i in range(start, start + 500)]
        )  # fmt: skip
        log.flush()
    log.close()
    text = (log.path / "steps.jsonl").stat().st_size
    # Before: each chunk stored every key for every row (81 MB of sidecar for 5 MB of text).
    assert _sidecar_bytes(log.path) < 2 * text
    h = open_run(log.path).history()
    assert isinstance(h, Columns) and len(h) == KEYS + 2 and h.rows == KEYS
    assert h.nbytes < 40 * KEYS  # step and loss dense, each probe one value and its row
    assert set(h.sparse) == {f"probe_{i}" for i in range(KEYS)}
    col = h["probe_7"]  # made full only when looked up
    assert col.shape == (KEYS,) and col[7] == 7.0 and np.isnan(np.delete(col, 7)).all()
    np.testing.assert_array_equal(h["loss"], 1.0 / np.arange(1, KEYS + 1))
    assert list(h)[:4] == ["step", "loss", "probe_0", "probe_1"]  # first-seen order


def test_sparse_and_dense_read_back_as_the_text(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 30)
    log = make_log(tmp_path)
    rng = np.random.default_rng(0)
    for i in range(120):
        row: dict[str, object] = {"step": float(i), "loss": float(rng.normal())}
        if i % 3 == 0:
            row["every_third"] = float(i)
        if i % 40 == 5:
            row[f"rare_{i}"] = float(rng.normal())
        if i == 60:
            row["nan_once"] = float("nan")
        log.write_steps([row])
        log.flush()
    got = open_run(log.path).history()  # open: chunks and the text past them
    assert_same_columns(dict(got), reference_columns(log.path / "steps.jsonl"))
    log.close()
    got = open_run(log.path).history()
    assert_same_columns(dict(got), reference_columns(log.path / "steps.jsonl"))
    assert "rare_5" in got.sparse and "loss" in got.dense


def test_chunks_written_before_sparse_keys_still_read(tmp_path: pathlib.Path) -> None:
    """Format 1 chunks (``names`` and a dense ``data``), as every run before this change."""
    log = make_log(tmp_path)
    rows = [{"step": float(i), "loss": 0.5 * i, **({"x": 1.0} if i == 3 else {})}
            for i in range(8)]  # fmt: skip
    log.write_steps(rows)
    log.close()
    steps = log.path / "steps.jsonl"
    for old in (log.path / "columns" / "steps").iterdir():
        old.unlink()
    data = np.array([[r.get(k, np.nan) for r in rows] for k in ("step", "loss", "x")])
    buf = io.BytesIO()
    np.savez(buf, names=np.array(["step", "loss", "x"]), data=data,
             span=np.array([0, steps.stat().st_size, 8]))  # fmt: skip
    (log.path / "columns" / "steps" / "000000.npz").write_bytes(buf.getvalue())
    run = open_run(log.path)
    h = run.history()
    assert_same_columns(dict(h), reference_columns(steps))
    h["loss"][0] = 5.0  # the caller's own arrays (not views of the file's bytes)
    assert run.offsets["steps"] == steps.stat().st_size  # from the chunk: no text parsed
