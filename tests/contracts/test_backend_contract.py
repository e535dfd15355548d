"""Every backend meets the one Backend protocol: fixed keys, NaN when unavailable, gauges, notes
that only grow, an idempotent close (DESIGN.md section 4)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from tests.backends.test_backends import cuda, gpus, make_backend, nvml  # noqa: F401 (fixtures)

from nbmonitor.backends import Backend, CpuBackend, CudaBackend, MpsBackend


def check_backend(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.name, str) and backend.name
    assert isinstance(backend.devices, tuple)
    assert backend.device_index is None or isinstance(backend.device_index, int)
    assert isinstance(backend.notes, list)
    keys = backend.keys
    assert len(set(keys)) == len(keys)
    for _ in range(2):  # the same keys every call, every value a float (NaN: unavailable)
        sample = backend.sample()
        assert tuple(sample) == keys or set(sample) == set(keys)
        assert all(isinstance(v, float) for v in sample.values())
    notes = list(backend.notes)
    gauges = backend.device_gauges(sample)
    assert isinstance(gauges, list) and len(gauges) == len(backend.devices)
    for gauge in gauges:
        assert isinstance(gauge.get("name"), str)
        assert all(isinstance(v, (float, str)) for v in gauge.values())
    assert backend.notes[: len(notes)] == notes  # notes only grow
    backend.close()
    backend.close()  # idempotent


def test_cpu_backend_meets_the_protocol() -> None:
    backend = CpuBackend()
    check_backend(backend)
    assert backend.device_index is None and backend.devices == ()


def test_mps_backend_meets_the_protocol_even_without_mps() -> None:
    backend = MpsBackend()
    check_backend(backend)
    sample = backend.sample()
    mps = [sample[k] for k in sample if k.startswith("mps_")]
    assert len(mps) == 3
    if not torch.backends.mps.is_available():  # unavailable is NaN, not an error
        assert all(math.isnan(v) for v in mps)


def test_cuda_backend_meets_the_protocol(make_backend: Callable[..., CudaBackend]) -> None:  # noqa: F811
    backend = make_backend()
    check_backend(backend)
    assert backend.device_index == 0 and len(backend.devices) >= 1


@pytest.mark.parametrize("name", ["cpu", "mps", "cuda"])
def test_every_backend_name_is_exported(name: str) -> None:
    import nbmonitor.backends as backends

    assert name in backends.BACKEND_NAMES
