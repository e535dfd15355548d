"""The FLOPs of the model's forward pass, counted once with ``torch.utils.flop_counter``.

``FlopCounterMode`` is entered as the first grad-enabled forward starts and left as it ends,
so only the model's own forward runs under it (once; every later forward runs untouched). It
counts the matrix products, convolutions and attention of that forward; a training step costs
about three forwards (the backward pass computes the gradients of both the inputs and the
weights of each product, twice the forward's work), which is how the sampler turns the count
into FLOPs per step, scaled by each step's tokens or samples (``_engine/derive/mfu.py``).
The counted forward runs slower (every operator goes through Python once).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from nbmonitor._capture.probes.base import ProbeBase, StepContext
from nbmonitor.errors import Guard
from nbmonitor.records import FlopsRecord


class FlopsProbe(ProbeBase):
    name = "flops"

    def __init__(self, guard: Guard, model: torch.nn.Module) -> None:
        super().__init__(guard)
        # Weakly: the model's hooks hold the probes, and it must be freed as soon as dropped.
        self._model = weakref.ref(model)
        self._counter: FlopCounterMode | None = None
        self._dtype = "float32"
        self.done = False

    def events(self) -> tuple[str, ...]:
        return ("forward_pre", "forward", "pre_step")

    def forward_pre(self, ctx: StepContext) -> None:
        if self.done:
            return
        self.stop()  # a count left open by a forward that raised
        model = self._model()
        if model is None:
            return
        self._dtype = compute_dtype(model)
        counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FORMULAS)
        counter.__enter__()  # type: ignore[no-untyped-call]
        self._counter = counter

    def forward(self, ctx: StepContext, output: Any) -> None:
        counter = self._counter
        if counter is None:
            return
        self._counter = None
        self.done = True
        ctx.retired.append(self)  # counted once: never called again
        counter.__exit__(None, None, None)  # type: ignore[no-untyped-call]
        ctx.recorder.put(
            FlopsRecord(
                step=ctx.step + 1,
                forward_flops=float(counter.get_total_flops()),
                tokens=ctx.forward_tokens,
                samples=ctx.forward_samples,
                dtype=self._dtype,
            )
        )

    def pre_step(self, ctx: StepContext) -> None:
        self.stop()

    def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Leave a count still open (its forward raised, or the monitor closes), dropping it."""
        counter, self._counter = self._counter, None
        if counter is not None:
            counter.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def _sdpa_flops(
    query_shape: tuple[int, ...],
    key_shape: tuple[int, ...],
    value_shape: tuple[int, ...],
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))  # type: ignore[no-untyped-call]


# Operators torch's counter has no formula for: the CPU kernel of scaled_dot_product_attention
# (the CUDA ones are counted by torch itself).
_CPU_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
EXTRA_FORMULAS: dict[Any, Any] = {_CPU_SDPA: _sdpa_flops} if _CPU_SDPA is not None else {}


def compute_dtype(model: torch.nn.Module) -> str:
    """The precision the model's matrix products run in now: autocast's, else the parameters'
    (float32 as ``"tfloat32"`` where CUDA matmuls may use TF32)."""
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    device = param.device.type if param is not None else "cpu"
    dtype = param.dtype if param is not None else torch.float32
    if device in ("cuda", "cpu", "mps", "xpu") and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float32 and device == "cuda" and _tf32():
        return "tfloat32"
    return name


def _tf32() -> bool:
    if torch.get_float32_matmul_precision() != "highest":
        return True
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    return precision == "tf32"
