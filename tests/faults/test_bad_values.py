"""A value mon.log cannot use is refused at the call in one line (type and shape checks, no
sync); one that fails later, on the sampler, never costs other data: it is dropped alone, with
an error naming its key, and every other key of its step, and every other step, reaches the
store and the disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.helpers import mlp

import nbmonitor
from nbmonitor._capture.device_value import DeviceValue
from nbmonitor.records import LogRecord, StepRecord


class FloatRaises:
    def __float__(self) -> float:
        raise ValueError("cannot read me")


class Unreadable(DeviceValue):
    """A device value whose copy never becomes readable (a failed device-to-host transfer)."""

    def __init__(self) -> None:
        super().__init__(torch.tensor([1.0, 2.0]))

    def values(self) -> list[float]:
        raise RuntimeError("injected: the copy failed")

    def floats(self) -> np.ndarray:
        raise RuntimeError("injected: the copy failed")

    def array(self) -> np.ndarray:
        raise RuntimeError("injected: the copy failed")

    def stack_alike(self, values):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected: the copy failed")


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize(
    ("bad", "kind", "error"),
    [
        (torch.tensor(1.0, device="meta"), ValueError, r"log\(bad=...\) got a tensor on the meta"),
        (10**400, ValueError, r"log\(bad=...\) got an int too large for a float"),
        (FloatRaises(), ValueError, r"log\(bad=...\) got a FloatRaises that cannot be read"),
        (np.array([1, 2]), TypeError, r"log\(bad=...\) got an array of shape \(2,\)"),
    ],
    ids=["meta-tensor", "int-too-large", "float-raises", "numpy-array"],
)
def test_a_value_that_cannot_be_used_is_refused_at_the_call(tmp_path, bad, kind, error):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for i in range(3):
            _step(model, opt)
            if i == 1:
                with pytest.raises(kind, match=error) as raised:
                    mon.log(acc=torch.tensor(0.5), bad=bad)
                assert "\n" not in str(raised.value)
            mon.log(loss=float(i), acc=torch.tensor(0.5))
            mon.log(n=np.float32(2.0), m=np.array(3.0))  # numpy scalars and 0-d arrays are fine
        assert mon.flush()
        live = mon.history()
    on_disk = nbmonitor.open(mon.run_dir).history()
    for h in (live, on_disk):
        assert h["step"].tolist() == [1.0, 2.0, 3.0]
        assert h["loss"].tolist() == [0.0, 1.0, 2.0]
        assert h["acc"].tolist() == [0.5, 0.5, 0.5]
        assert h["m"].tolist() == [3.0, 3.0, 3.0]
        assert "bad" not in h
    assert not [e for e in mon.errors if "log:" in e]


def test_a_complex_or_non_numeric_value_is_still_the_callers_type_error(tmp_path):
    model = mlp()
    with nbmonitor.attach(model, run_dir=tmp_path, display=False, interval=60) as mon:
        with pytest.raises(TypeError, match=r"log\(z=...\) got a complex tensor"):
            mon.log(z=torch.tensor(1 + 1j))
        with pytest.raises(TypeError, match=r"log\(s=...\) needs a number"):
            mon.log(s="0.5")


def test_a_record_that_fails_to_convert_on_the_sampler_costs_only_its_keys(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        recorder = mon.internals.recorder
        for i in range(4):
            _step(model, opt)
            mon.log(loss=float(i))
            if i == 1:
                # A value that fails on the sampler, in the same drained batch as the rest.
                bad = LogRecord(mon.step, {"kept": 7.0}, [(("lost_a", "lost_b"), Unreadable())])
                recorder.put(bad)
                # A step record whose learning rate and norms cannot be read.
                recorder.put(StepRecord(99, 0.0, 0.1, 4, 1, (Unreadable(),), Unreadable()))
        assert mon.flush()
        live = mon.history()
    on_disk = nbmonitor.open(mon.run_dir).history()
    for h in (live, on_disk):
        assert h["step"].tolist() == [1.0, 2.0, 3.0, 4.0, 99.0]
        assert h["loss"].tolist()[:4] == [0.0, 1.0, 2.0, 3.0]
        assert np.isfinite(h["grad_norm"][:4]).all()  # the other steps keep their norms
        assert h["kept"][1] == 7.0
        assert "lost_a" not in h
        assert np.isnan(h["lr"][4]) and np.isnan(h["grad_norm"][4])
    errors = "\n".join(mon.errors)
    assert "log:lost_a" in errors and "log:lost_b" in errors
    assert "records:lr" in errors and "records:grad_norm" in errors


def test_a_bad_value_every_step_is_one_error_per_tick_not_one_per_step(tmp_path):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for i in range(20):
            _step(model, opt)
            mon.log(loss=float(i))
            # A value whose copy fails on the sampler, every step.
            mon.internals.recorder.put(LogRecord(mon.step, {}, [(("bad",), Unreadable())]))
        assert mon.flush()
        assert sum("log:bad" in e for e in mon.errors) == 1
        assert mon.history()["loss"].tolist() == [float(i) for i in range(20)]
