"""Reading a run directory: round-trips, torn lines, corruption, errors, and the sidecar
reading back exactly what the JSON Lines say (moved from tests/test_runlog.py, plus new)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import socket

import numpy as np
import pytest
from tests.runs.runs_helpers import assert_same_columns, make_log, reference_columns

import nbmonitor
from nbmonitor.runs import (
    Run,
    RunCorruptError,
    RunDataWarning,
    RunDirError,
    RunNotFoundError,
    decode,
    open_run,
    reader,
    sidecar,
)
from nbmonitor.sinks import Batch


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few rows, so short test runs exercise several of them."""
    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 40)


def test_reader_sees_flushed_rows_while_the_run_is_open(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    try:
        log.write_steps([{"step": 0.0, "time": 1.0, "loss": 2.5}])
        log.write_steps([{"step": 1.0, "time": 2.0, "loss": 2.0, "grad_norm/layer1.weight": 0.5}])
        log.write_samples([{"time": 1.5, "step": 0.0, "cpu_percent": 50.0}])
        log.write_events([{"time": 1.7, "kind": "alert", "rule": "nan", "layers": ["a", "b"]}])
        log.flush()
        run = open_run(log.path)
        assert isinstance(run, Run)
        assert run.meta["model"] == "MLP"
        h = run.history()
        assert list(h) == ["step", "time", "loss", "grad_norm/layer1.weight"]
        np.testing.assert_array_equal(h["step"], [0.0, 1.0])
        np.testing.assert_array_equal(h["loss"], [2.5, 2.0])
        np.testing.assert_array_equal(h["grad_norm/layer1.weight"], [np.nan, 0.5])
        assert all(v.dtype == np.float64 for v in h.values())
        np.testing.assert_array_equal(run.system()["cpu_percent"], [50.0])
        assert run.records("events") == [
            {"time": 1.7, "kind": "alert", "rule": "nan", "layers": ["a", "b"]}
        ]
        [alert] = run.events()  # the same record as an alert, typed
        assert (alert.rule, alert.layers, alert.time, alert.severity) == (
            "nan",
            ("a", "b"),
            1.7,
            "info",
        )
        assert alert["layers"] == ["a", "b"]
        # More rows after the first read show up on the next one.
        log.write_steps([{"step": 2.0, "time": 3.0, "loss": 1.0}])
        log.flush()
        np.testing.assert_array_equal(run.history()["step"], [0.0, 1.0, 2.0])
    finally:
        log.close()


def test_nonfinite_values_round_trip_exactly(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    values = [math.nan, math.inf, -math.inf, 0.1, -0.0, 1e-310, 1.7976931348623157e308]
    log.write_steps([{"step": float(i), "v": v} for i, v in enumerate(values)])
    log.write_steps([{"step": 99.0, "v": np.float64(3.25)}])  # numpy scalars too
    log.close()
    v = open_run(log.path).history()["v"]
    assert math.isnan(v[0])
    assert v[1] == math.inf and v[2] == -math.inf
    assert v[3] == 0.1 and math.copysign(1.0, v[4]) == -1.0
    assert v[5] == 1e-310 and v[6] == 1.7976931348623157e308
    assert v[7] == 3.25
    text = (log.path / "steps.jsonl").read_text()
    assert "NaN" in text and "Infinity" in text and "-Infinity" in text


def test_torn_last_line_is_skipped(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.write_steps([{"step": float(i), "loss": 1.0} for i in range(3)])
    log.close()
    steps = log.path / "steps.jsonl"
    with open(steps, "ab") as f:
        f.write(b'{"step":3.0,"lo')  # a write cut off by a kill: no newline
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0, 1, 2])
    with open(steps, "ab") as f:
        f.write(b"ss\x00garbage\n")  # completed with a newline but unparsable: still the last
    np.testing.assert_array_equal(open_run(log.path).history()["step"], [0, 1, 2])


def test_corrupt_line_in_the_middle_is_skipped_and_named(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    log.close()
    (log.path / "steps.jsonl").write_bytes(b'{"step":0}\nnot json\n{"step":2}\n')
    with pytest.warns(RunDataWarning, match=r"steps\.jsonl line 2: not JSON") as got:
        h = open_run(log.path).history()
    np.testing.assert_array_equal(h["step"], [0.0, 2.0])  # the good records around it
    assert len(got) == 1 and "\n" not in str(got[0].message)


def test_empty_run_reads_empty(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    try:
        run = open_run(log.path)
        assert run.history() == {} and run.system() == {} and run.events() == []
        assert run.layers() == {}
    finally:
        log.close()


def test_layer_rows_round_trip(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    try:
        log.write_layers([{"step": 10.0, "update_ratio/fc.weight": 1e-3}])
        log.flush()
        layers = open_run(log.path).layers()
        assert list(layers["step"]) == [10.0]
        assert layers["update_ratio/fc.weight"][0] == 1e-3
    finally:
        log.close()


# -- the sidecar reads back what the JSON Lines say --------------------------------------------


def _awkward_rows(n: int, start: int = 0) -> list[dict[str, object]]:
    """Rows with NaN, +-Inf, -0.0, keys that come and go, a key first seen late, a bool, a
    null, a string and lists: everything the sidecar must agree with the text on."""
    rows: list[dict[str, object]] = []
    for i in range(start, start + n):
        row: dict[str, object] = {"step": float(i), "time": 1.7e9 + i / 3}
        if i % 3:
            row["loss"] = [math.nan, math.inf, -math.inf, -0.0, 1 / (i + 1)][i % 5]
        if i >= 17:
            row["late/key"] = i * 0.1
        if i % 11 == 0:
            row["flag"] = True
            row["nothing"] = None
            row["pair"] = [i, i]  # the same shape in every row: numpy would make it 2-D
        if i % 13 == 0:
            row["note"] = "not a number"
        rows.append(row)
    return rows


def test_sidecar_reads_the_same_as_the_text(tmp_path: pathlib.Path, small_chunks: None) -> None:
    log = make_log(tmp_path)
    for i in range(0, 60, 7):
        log.write(Batch({"steps": _awkward_rows(7, i)}))
        log.flush()
    log.close()
    chunks = sorted((log.path / "columns" / "steps").iterdir())
    assert len(chunks) >= 3
    assert_same_columns(open_run(log.path).history(), reference_columns(log.path / "steps.jsonl"))


def test_closed_run_reads_no_text(
    tmp_path: pathlib.Path, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(tmp_path)
    log.write_steps(_awkward_rows(50))
    log.flush()
    log.close()
    parsed: list[bytes] = []

    def spy(data: bytes) -> decode.Decoded:
        parsed.append(data)
        return decode.decode_lines(data)

    monkeypatch.setattr(reader, "decode_lines", spy)
    run = open_run(log.path)
    assert len(run.history()["step"]) == 50
    assert parsed == []  # every record came from the sidecar
    assert run.offsets["steps"] == (log.path / "steps.jsonl").stat().st_size


def test_killed_writer_reads_text_past_the_last_chunk(
    tmp_path: pathlib.Path, small_chunks: None
) -> None:
    log = make_log(tmp_path)
    log.write_steps(_awkward_rows(30))
    log.flush()  # cuts a chunk
    log.write_steps(_awkward_rows(5, 30))
    log.flush()  # below the chunk size: on disk as text only
    steps = log.path / "steps.jsonl"
    with open(steps, "ab") as f:
        f.write(b'{"step":35.0,"lo')  # the kill tore a line
    # Read before close: as a killed writer leaves it (no final chunk, no status).
    assert len(list((log.path / "columns" / "steps").iterdir())) == 1
    h = open_run(log.path).history()
    assert len(h["step"]) == 35
    assert_same_columns(h, reference_columns(steps))
    log.close()


def test_sidecar_ahead_of_the_text_is_not_used(tmp_path: pathlib.Path, small_chunks: None) -> None:
    log = make_log(tmp_path)
    log.write_steps(_awkward_rows(40))
    log.close()
    steps = log.path / "steps.jsonl"
    data = steps.read_bytes()
    steps.write_bytes(data[: data.index(b"\n", len(data) // 2) + 1])  # lost its second half
    h = open_run(log.path).history()
    assert 0 < len(h["step"]) < 40
    assert_same_columns(h, reference_columns(steps))


def test_damaged_chunk_falls_back_to_text(tmp_path: pathlib.Path, small_chunks: None) -> None:
    log = make_log(tmp_path)
    for i in range(0, 40, 10):
        log.write_steps(_awkward_rows(10, i))
        log.flush()
    log.close()
    chunks = sorted((log.path / "columns" / "steps").iterdir())
    chunks[1].write_bytes(b"PK\x03\x04 not a zip")
    h = open_run(log.path).history()
    assert len(h["step"]) == 40
    assert_same_columns(h, reference_columns(log.path / "steps.jsonl"))


def test_run_written_before_the_sidecar_still_reads(tmp_path: pathlib.Path) -> None:
    run_dir = tmp_path / "20240101-000000-old"
    run_dir.mkdir()
    meta = {"format_version": 1, "files": {"steps": "steps.jsonl", "system": "system.jsonl",
            "events": "events.jsonl", "layers": "layers.jsonl"}}  # fmt: skip
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (run_dir / "steps.jsonl").write_bytes(b'{"step":0.0,"loss":NaN}\n{"step":1.0,"loss":0.5}\n')
    h = nbmonitor.open(run_dir).history()
    np.testing.assert_array_equal(h["loss"], [np.nan, 0.5])
    assert open_run(run_dir).layers() == {}  # no layers.jsonl at all


def test_fast_and_plain_json_agree(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(tmp_path)
    rng = np.random.default_rng(0)
    log.write_steps([{"step": float(i), "x": float(v)} for i, v in enumerate(rng.normal(size=500))])
    log.write_steps([{"step": 500.0, "big": 2**70, "x": 1e-320}])  # orjson rejects 2**70
    log.flush()
    fast = open_run(log.path).history()
    monkeypatch.setattr(decode, "_fast_loads", None)
    assert_same_columns(fast, open_run(log.path).history())
    assert fast["big"][-1] == float(2**70)
    log.close()


# -- bad inputs, status ------------------------------------------------------------------------


def test_open_missing_run_says_what_to_do(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError, match="no run at"):
        open_run(tmp_path / "nope")


@pytest.mark.parametrize("what", ["missing", "file", "not a run"])
def test_bad_paths_raise_one_line(tmp_path: pathlib.Path, what: str) -> None:
    path = tmp_path / "x"
    if what == "file":
        path.write_text("hello")
    elif what == "not a run":
        path.mkdir()
    with pytest.raises(RunNotFoundError) as info:
        nbmonitor.open(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"nbmonitor: no run at '{path}'")
    assert "pass the folder of one run" in msg
    assert isinstance(info.value, RunDirError) and isinstance(info.value, FileNotFoundError)
    assert nbmonitor.RunDirError is RunDirError


def test_damaged_meta_raises_one_line(tmp_path: pathlib.Path) -> None:
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(RunCorruptError, match=r"meta\.json is not valid JSON") as info:
        open_run(tmp_path)
    assert "\n" not in str(info.value)


def test_status_from_meta_and_pid(tmp_path: pathlib.Path) -> None:
    log = make_log(tmp_path)
    run = open_run(log.path)
    assert run.meta["pid"] and run.meta["host"] == socket.gethostname()
    assert run.status == "running"  # this process wrote it and is alive
    log.close({"status": "degraded", "end_time": "2024-01-01T00:00:00+00:00"})
    assert run.status == "degraded"
    log.update_meta(status="closed")
    assert run.status == "closed"


def _meta(path: pathlib.Path, **fields: object) -> None:
    path.mkdir()
    (path / "meta.json").write_text(json.dumps({"format_version": 1, **fields}))


def test_status_of_a_dead_writer_and_of_another_host(tmp_path: pathlib.Path) -> None:
    # A pid that cannot be alive (above any pid_max) on this host: the writer was killed.
    _meta(tmp_path / "a", host=socket.gethostname(), pid=2**31 - 2)
    assert open_run(tmp_path / "a").status == "killed"
    # Written from another host: only the files' age tells.
    _meta(tmp_path / "b", host="elsewhere.invalid", pid=12345)
    steps = tmp_path / "b" / "steps.jsonl"
    steps.write_bytes(b'{"step":0}\n')
    assert open_run(tmp_path / "b").status == "running"
    old = steps.stat().st_mtime - 3600
    os.utime(steps, (old, old))
    assert open_run(tmp_path / "b").status == "unknown"


def test_values_that_are_not_numbers_read_as_nan() -> None:
    cols = decode.to_columns([{"a": [1, 2], "b": "x", "c": 1}, {"a": [3, 4], "b": None, "c": True}])
    assert cols["a"].shape == (2,) and np.isnan(cols["a"]).all()  # not stacked into 2-D
    assert np.isnan(cols["b"]).all()
    np.testing.assert_array_equal(cols["c"], [1.0, 1.0])
