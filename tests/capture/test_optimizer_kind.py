"""What the time rules are told about the optimizer: which implementation its step runs and
which faster one it offers, read from torch's own defaults at attach."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nbmonitor._capture.optimizer_kind import describe


def params() -> list[torch.nn.Parameter]:
    return list(torch.nn.Linear(3, 2).parameters())


@pytest.mark.parametrize(
    ("make", "implementation", "can_fuse", "can_foreach"),
    [
        # On the CPU torch's default (foreach=None) is the for-loop; fused kernels exist.
        (lambda p: torch.optim.Adam(p), "for-loop", True, True),
        (lambda p: torch.optim.AdamW(p, foreach=True), "foreach", True, True),
        (lambda p: torch.optim.Adam(p, fused=True), "fused", True, True),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "for-loop", True, True),
        # No fused implementation of RMSprop; none of either for LBFGS.
        (lambda p: torch.optim.RMSprop(p), "for-loop", False, True),
        (lambda p: torch.optim.LBFGS(p), "unknown", False, False),
        # differentiable=True rules both out.
        (lambda p: torch.optim.Adam(p, differentiable=True), "for-loop", False, False),
    ],
    ids=["adam", "adamw-foreach", "adam-fused", "sgd", "rmsprop", "lbfgs", "differentiable"],
)
def test_torch_optimizers_on_the_cpu(
    make: Any, implementation: str, can_fuse: bool, can_foreach: bool
) -> None:
    optimizer = make(params())
    record = describe(optimizer, 7)
    assert record.step == 7 and record.name == type(optimizer).__name__
    assert record.device == "cpu"
    assert (record.implementation, record.can_fuse, record.can_foreach) == (
        implementation,
        can_fuse,
        can_foreach,
    )


class Lion(torch.optim.Optimizer):
    """Another library's optimizer: no fused or foreach option."""

    def __init__(self, parameters: Any) -> None:
        super().__init__(parameters, {"lr": 1e-4})

    def step(self, closure: Any = None) -> None:
        return None


def test_another_librarys_optimizer_is_unknown() -> None:
    record = describe(Lion(params()), 0)
    assert (record.name, record.implementation, record.can_fuse) == ("Lion", "unknown", False)


def test_a_meta_device_optimizer_takes_its_device_from_its_parameters() -> None:
    p = torch.nn.Parameter(torch.empty(3, device="meta"))
    record = describe(torch.optim.Adam([p]), 0)
    assert record.device == "meta" and record.implementation == "for-loop"
    assert not record.can_fuse  # no fused kernels on the meta device
