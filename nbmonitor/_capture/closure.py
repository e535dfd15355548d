"""An optimizer step given a closure (``optimizer.step(closure)``: Lightning, LBFGS) runs the
forward and backward inside: its gradients are final once the closure returns, after the
optimizer's pre-step hooks ran. The step clock's pre-step hook hands the step a closure that
calls back then (a pre-step hook may return new arguments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def after_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], then: Callable[[], None]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The step's ``(args, kwargs)`` with its closure replaced by one that calls ``then`` after
    its first return (LBFGS calls it again, with gradients of other points); None without a
    closure. ``args[0]`` is the optimizer."""
    closure = kwargs.get("closure")
    positional = closure is None and len(args) > 1 and callable(args[1])
    if positional:
        closure = args[1]
    if not callable(closure):
        return None
    done = False

    def closure_then() -> Any:
        nonlocal done
        result = closure()
        if not done:
            done = True
            then()
        return result

    if positional:
        return (args[0], closure_then, *args[2:]), kwargs
    return args, {**kwargs, "closure": closure_then}
