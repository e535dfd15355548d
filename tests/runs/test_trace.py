"""The Chrome/Perfetto trace of a run: valid trace JSON, steps, phases and spans on their
tracks, one process per rank, from a live monitor and from a run opened later."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import mlp, train

import nbmonitor
from nbmonitor.runs.trace import chrome_trace


def traced_run(tmp_path: Path) -> tuple[Path, Path]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path / "runs", display=False) as mon:
        for _ in range(3):
            with mon.span("data"), mon.span("decode"):
                pass
            train(model, opt, mon, 1)
        # While the run goes on, the steps so far (the last one's row is still open).
        running = json.loads(mon.export_trace(tmp_path / "running.json").read_text())
        assert {e["name"] for e in running["traceEvents"]} >= {"step 1", "step 2"}
    out = mon.export_trace(tmp_path / "trace.json")  # closed: every step
    return mon.run_dir, out


def check_chrome_trace(trace: Any) -> list[dict[str, Any]]:
    """The parts of the trace event format a trace viewer needs, checked event by event."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    events = trace["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M")
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert isinstance(e["name"], str)
            assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["dur"] >= 0
        else:
            assert e["name"] in ("process_name", "thread_name") and e["args"]["name"]
    return [e for e in events if e["ph"] == "X"]


def test_export_trace_writes_a_valid_chrome_trace(tmp_path: Path) -> None:
    run_dir, out = traced_run(tmp_path)
    trace = json.loads(out.read_text())  # plain JSON: no NaN, no Infinity
    spans = check_chrome_trace(trace)
    names = {(e["tid"], e["name"]) for e in spans}
    assert {(1, "step 1"), (1, "step 3")} <= names
    assert {(2, "forward"), (2, "backward"), (2, "optimizer")} <= names
    assert {(3, "data"), (3, "decode")} <= names
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"steps", "phases", "spans"}
    # The nested span lies inside its parent, and each step's phases inside the step (to 1 us:
    # Unix seconds as float64 resolve about 0.24 us).
    user = [e for e in spans if e["tid"] == 3]  # the "data" phase is on tid 2
    data = sorted((e for e in user if e["name"] == "data"), key=lambda e: e["ts"])
    decode = sorted((e for e in user if e["name"] == "decode"), key=lambda e: e["ts"])
    assert len(data) == len(decode) == 3
    for outer, inner in zip(data, decode, strict=True):
        assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer[
            "dur"] + 1  # fmt: skip
    step2 = next(e for e in spans if e["name"] == "step 2")
    for phase in (e for e in spans if e["tid"] == 2 and e["args"]["step"] == 2):
        assert step2["ts"] - 1 <= phase["ts"]
        assert phase["ts"] + phase["dur"] <= step2["ts"] + step2["dur"] + 1
    # The same trace from the run opened later, without the monitor.
    again = nbmonitor.open(run_dir).export_trace(tmp_path / "again.json")
    assert json.loads(again.read_text()) == trace


def test_one_process_per_rank(tmp_path: Path) -> None:
    run_dir, _ = traced_run(tmp_path)
    # A run folder holding another rank's run (rank<N>/), as multi-rank runs will.
    shutil.copytree(run_dir, run_dir / "rank1")
    trace = chrome_trace(run_dir)
    processes = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert processes == {0: "rank 0", 1: "rank 1"}
    spans = check_chrome_trace(trace)
    assert {e["pid"] for e in spans} == {0, 1}


def test_export_trace_refuses_a_folder(tmp_path: Path) -> None:
    run_dir, _ = traced_run(tmp_path)
    with pytest.raises(ValueError, match="pass a file name"):
        nbmonitor.open(run_dir).export_trace(tmp_path)


def test_export_trace_that_fails_halfway_leaves_the_old_file_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.hostile.corpus import plain

    from nbmonitor import _atomic

    run = plain(tmp_path, "run")
    out = tmp_path / "trace.json"
    out.write_text('{"traceEvents": []}')

    real_open = open

    class Full:  # the disk fills up after the first bytes
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            self.f.write(data[:10])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(_atomic, "open", lambda p, m: Full(real_open(p, m)), raising=False)
    with pytest.raises(OSError, match="No space"):
        nbmonitor.open(run).export_trace(out)
    assert out.read_text() == '{"traceEvents": []}'  # untouched, not truncated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "trace.json"]  # no temp left
