"""list_runs: a folder of runs as a table, newest first, without parsing whole files."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import pytest

import nbmonitor
from nbmonitor.runs import RunNotFoundError, RunTable, list_runs, sidecar
from nbmonitor.runs.catalog import COLUMNS, count_rows, last_value
from nbmonitor.sinks import RunLogSink


def _two_runs(root: pathlib.Path) -> tuple[RunLogSink, RunLogSink]:
    old = RunLogSink.create(root, "old", {"start_timestamp": 1000.0, "backend": {"name": "cpu"},
                                          "start_time": "1970-01-01T00:16:40+00:00"})  # fmt: skip
    old.write_steps([{"step": float(i), "loss": 2.0 - i / 10} for i in range(10)])
    old.close({"status": "closed", "steps": 10})
    # started now by this process: alive, so "running"
    new = RunLogSink.create(root, "new<b>", {"start_timestamp": time.time(), "backend": "cuda"})
    # loss logged every 3rd step: the last record has none, the one before does
    new.write_steps([{"step": float(i), **({"loss": 0.5} if i % 3 == 0 else {})}
                     for i in range(5)])  # fmt: skip
    new.flush()
    return old, new


def test_rows_newest_first(tmp_path: pathlib.Path) -> None:
    old, new = _two_runs(tmp_path)
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    table = nbmonitor.list_runs(tmp_path)
    assert isinstance(table, RunTable) and len(table) == 2
    a, b = table.rows
    assert list(a) == list(COLUMNS)
    assert a["name"] == new.path.name and a["status"] == "running" and a["steps"] == 5
    assert a["final_loss"] == 0.5 and a["backend"] == "cuda" and a["path"] == str(new.path)
    assert b["name"] == old.path.name and b["status"] == "closed" and b["steps"] == 10
    assert b["final_loss"] == pytest.approx(1.1) and b["backend"] == "cpu"
    assert b["start"] == "1970-01-01T00:16:40+00:00"
    text = str(table)
    assert text.splitlines()[0].split() == list(COLUMNS)
    assert new.path.name in text and "1.1" in text
    page = table._repr_html_()
    assert "<table>" in page and "new&lt;b&gt;" not in page  # sanitised name: new-b
    assert "<b>" not in page
    new.close()


def test_html_escapes(tmp_path: pathlib.Path) -> None:
    t = RunTable([{**dict.fromkeys(COLUMNS, ""), "name": "<script>", "final_loss": math.nan}])
    assert "&lt;script&gt;" in t._repr_html_() and "<script>" not in t._repr_html_()


def test_to_pandas(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _old, new = _two_runs(tmp_path)
    new.close()
    df = list_runs(tmp_path).to_pandas()
    assert list(df.columns) == list(COLUMNS) and len(df) == 2
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        list_runs(tmp_path).to_pandas()


def test_empty_and_missing_folders(tmp_path: pathlib.Path) -> None:
    assert len(list_runs(tmp_path)) == 0 and "(no runs)" in str(list_runs(tmp_path))
    with pytest.raises(RunNotFoundError, match="cannot list runs") as info:
        list_runs(tmp_path / "nope")
    assert "\n" not in str(info.value)
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunNotFoundError, match="not a folder"):
        list_runs(tmp_path / "f")


def test_damaged_meta_is_a_row_not_an_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "meta.json").write_text("{")
    (row,) = list_runs(tmp_path).rows
    assert row["name"] == "bad" and row["status"] == "unreadable (damaged meta.json)"


def test_count_rows_uses_chunks_and_text(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sidecar, "CHUNK_VALUES", 30)
    log = RunLogSink.create(tmp_path, "n", {})
    for i in range(0, 97, 7):
        log.write_steps([{"step": float(j), "loss": 1.0} for j in range(i, min(i + 7, 97))])
        log.flush()
    with open(log.path / "steps.jsonl", "ab") as f:
        f.write(b'{"step":97')  # torn: not counted
    assert (log.path / "columns" / "steps").is_dir()
    assert count_rows(nbmonitor.open(log.path)) == 97
    log.close()


def test_last_value_scans_back_across_blocks(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "s.jsonl"
    filler = b"".join(json.dumps({"step": i, "x": "y" * 100}).encode() + b"\n" for i in range(2000))
    path.write_bytes(b'{"step":0,"loss":3.5}\n' + filler + b'{"loss":1')
    assert last_value(path, "loss") == 3.5  # found 200 kB back, torn last line ignored
    assert math.isnan(last_value(path, "nope"))
    assert math.isnan(last_value(tmp_path / "missing.jsonl", "loss"))
