"""The OOM report's parts without a kernel: which errors are OOMs, what was being allocated,
the module and phase from the traceback, the largest tensors, and free_oom's references."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

from nbmonitor.live import oom


def test_which_errors_are_out_of_memory() -> None:
    assert (
        oom.oom_kind(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        == "cuda"
    )
    assert oom.oom_kind(RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)")) == "mps"
    assert (
        oom.oom_kind(
            RuntimeError(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate 12 bytes"
            )
        )
        == "cpu"
    )
    assert oom.oom_kind(MemoryError()) == "cpu"
    assert oom.oom_kind(RuntimeError("shape mismatch")) is None
    assert oom.oom_kind(ValueError("out of memory")) is None


def test_what_was_being_allocated() -> None:
    assert (
        oom.requested_bytes("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0)") == 2 * 2**30
    )
    assert oom.requested_bytes("Tried to allocate 256.00 MiB on private pool") == 256 * 2**20
    assert oom.requested_bytes("you tried to allocate 4096 bytes. Error code 12") == 4096
    assert math.isnan(oom.requested_bytes("out of memory"))


def test_module_phase_and_the_tensors_the_traceback_holds() -> None:
    class Block(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            wide = torch.zeros(1000, 100)
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 1.00 GiB {wide.shape}"
            )

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block())
    names = {id(m): n for n, m in model.named_modules()}
    with pytest.raises(torch.OutOfMemoryError) as info:
        model(torch.randn(2, 4))
    module, phase, held = oom.where(info.value.__traceback__, names)
    assert (module, phase) == ("1", "forward")
    tensors = oom.largest_tensors(held, oom.storage_labels(model, None), scan=False)
    assert tensors[0].nbytes == 1000 * 100 * 4
    assert tensors[0].what.startswith("local `wide` in ")
    assert tensors[0].what.endswith("Block.forward (1)")
    # The model itself is named by its class alone: "Sequential.forward", no "((root))".
    places = {what for t in tensors if (what := t.what).startswith("local `input` in ")}
    assert places == {"local `input` in Sequential.forward"}, places


def test_free_oom_drops_the_stored_error_and_its_frames() -> None:
    def fail() -> None:
        kept = torch.ones(1000)
        raise MemoryError(str(kept.shape))

    try:
        fail()
    except MemoryError as exc:
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        error = exc
    freed = oom.free_oom(None, None)
    assert sys.last_value is None and sys.last_traceback is None
    assert error.__traceback__ is None
    assert "sys.last_traceback" in freed.released and "the error's frames" in freed.released
    assert freed.what == "resident memory (RSS)" and "came back" in str(freed)


class _WarnsOnClass:
    """Like ``torch.distributed.reduce_op``: reading ``__class__`` warns (deprecated)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        import warnings

        warnings.warn("deprecated", FutureWarning, stacklevel=2)
        return _WarnsOnClass


def test_the_tensor_scan_reads_no_attribute_of_other_objects() -> None:
    # Found on an H200: the scan's isinstance() read __class__ of torch's deprecated
    # reduce_op, so a real OOM report raised a FutureWarning (an error under pytest).
    lurker = [_WarnsOnClass()]
    big = torch.zeros(1000)
    tensors = oom.largest_tensors([], {}, scan=True)  # warnings are errors in this suite
    assert any(t.nbytes >= big.nbytes for t in tensors)
    assert lurker


def test_a_script_gets_the_report_of_an_error_it_caught(tmp_path: pathlib.Path) -> None:
    import nbmonitor

    class Greedy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.empty(2**62, dtype=torch.uint8).sum()  # the CPU allocator refuses

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Greedy())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        model[0](torch.randn(2, 4)).sum().backward()
        opt.step()
        with pytest.raises(RuntimeError, match="can't allocate memory") as info:
            model(torch.randn(2, 4))
        report = mon.oom_report(info.value)
        with pytest.raises(ValueError, match="takes an out-of-memory error, got KeyError"):
            mon.oom_report(KeyError("x"))
    assert (report.kind, report.module, report.phase) == ("cpu", "1", "forward")
    assert report.requested_bytes == 2**62 and report.step == 1
    assert report.breakdown is not None and report.advice
