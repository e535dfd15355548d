"""attach(..., memory_history=True): the CUDA allocator's history, turned on and off with the
monitor, snapshots written where asked, and the OOM card's link. The allocator calls are
faked here (no GPU); tests/gpu/test_memory_gpu.py runs them for real."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import nbmonitor
from nbmonitor.live.memory_history import MAX_ENTRIES, MemoryHistory
from nbmonitor.memory import OomReport
from nbmonitor.ui.oom_card import card_html, card_text


def test_history_needs_cuda() -> None:
    with pytest.raises(ValueError, match="memory_history=True records the CUDA allocator"):
        nbmonitor.attach(torch.nn.Linear(2, 2), None, memory_history=True, display=False)
    with pytest.raises(TypeError, match="memory_history must be True or False"):
        nbmonitor.attach(torch.nn.Linear(2, 2), None, memory_history="yes", display=False)


def test_a_snapshot_without_history_is_a_one_line_error(tmp_path: Path) -> None:
    mon = nbmonitor.attach(torch.nn.Linear(2, 2), None, run_dir=tmp_path, display=False)
    try:
        with pytest.raises(RuntimeError, match="needs attach"):
            mon.memory_snapshot(tmp_path / "x.pickle")
    finally:
        mon.close()


def test_history_is_recorded_and_dumped_through_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(
        torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(("record", kw))
    )

    def dump(path: str) -> None:
        calls.append(("dump", path))
        Path(path).write_bytes(b"pickle")

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    history = MemoryHistory("cuda")
    with pytest.raises(RuntimeError, match="no allocation history"):
        history.dump(tmp_path / "early.pickle")
    history.start()
    written = history.dump(tmp_path / "deep" / "snap.pickle")
    assert written.read_bytes() == b"pickle"
    history.stop()
    history.stop()  # once only
    assert [(what, arg) for what, arg in calls if what == "record"] == [
        ("record", {"enabled": "all", "max_entries": MAX_ENTRIES}),
        ("record", {"enabled": None}),
    ]
    # torch writes beside the snapshot, which then replaces it whole: no half file is seen
    (dumped,) = [Path(arg) for what, arg in calls if what == "dump"]
    assert dumped.parent == written.parent and written.name == "snap.pickle"
    assert sorted(p.name for p in written.parent.iterdir()) == ["snap.pickle"]


def test_the_card_links_the_snapshot() -> None:
    report = OomReport(
        kind="cuda",
        message="CUDA out of memory. Tried to allocate 2.00 GiB",
        requested_bytes=2 * 2**30,
        module="layers.3",
        phase="backward",
        step=41,
        breakdown=None,
        peaks=((40, 70 * 2**30),),
        peak_key="cuda_interval_peak_bytes",
        tensors=(),
        advice=("mon.free_oom() ...",),
        snapshot="runs/x/oom-step42.pickle",
    )
    text = card_text(report)
    assert text.startswith(
        "nbmonitor: CUDA out of memory, allocating 2 GiB in the backward of module layers.3 "
        "at step 42."
    )
    assert "oom-step42.pickle (https://pytorch.org/memory_viz)" in text
    assert "https://pytorch.org/memory_viz" in card_html(report)
