"""settle_heap: glibc's dynamic malloc thresholds are raised once per process, at attach."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import nbmonitor
from nbmonitor._capture import heap as _heap
from nbmonitor.live import monitor as _monitor

glibc_only = pytest.mark.skipif(
    not _heap.is_glibc(), reason="glibc's malloc only (a no-op elsewhere)"
)

# In a fresh process: settle the heap first (argv[1] == "settle") or not, then ask whether a
# 28 MiB block is served by mmap (True) or from the heap (False), then settle again. The probe
# runs once per process: freeing its own block raises the thresholds too.
# mallinfo2().hblkhd is the bytes held in mmap-ed blocks.
_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from nbmonitor._capture.heap import settle_heap

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def mapped(n):
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(n)
        after = libc.mallinfo2().hblkhd
        libc.free(block)
        return after - before >= n

    first = settle_heap() if sys.argv[1] == "settle" else None
    print(first, mapped(28 * 2**20), settle_heap())
    """
)


def probe(settle: bool, **env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, "settle" if settle else "plain"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **env},
    )
    return out.stdout.split()


@glibc_only
def test_settle_heap_raises_glibcs_thresholds_once_per_process():
    # Unsettled, a 28 MiB block is mapped; settled, it comes from the heap, and a second
    # settle_heap() in the same process does nothing.
    assert probe(settle=False) == ["None", "True", "True"]
    assert probe(settle=True) == ["True", "False", "False"]


@glibc_only
def test_settle_heap_changes_nothing_when_the_user_set_the_thresholds():
    # MALLOC_MMAP_THRESHOLD_ turns glibc's dynamic thresholds off: the user's setting stands.
    assert probe(settle=True, MALLOC_MMAP_THRESHOLD_=str(128 * 1024)) == ["True", "True", "False"]


def test_settle_heap_does_nothing_off_glibc(monkeypatch):
    monkeypatch.setattr(_heap, "_settled", False)
    monkeypatch.setattr(_heap.os, "confstr", lambda name: "musl")
    assert not _heap.is_glibc()
    assert _heap.settle_heap() is False
    assert _heap._settled is False


def test_settle_heap_without_confstr(monkeypatch):
    def refuse(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(_heap.os, "confstr", refuse)
    assert not _heap.is_glibc()


def test_attach_settles_the_heap_before_the_first_step(monkeypatch, tmp_path: Path):
    calls: list[int] = []
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def settle() -> bool:
        calls.append(len(opt._optimizer_step_pre_hooks))  # no hook installed yet
        return True

    monkeypatch.setattr(_monitor, "settle_heap", settle)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60):
        assert calls == [0]
