"""The step's loss when the loop logs none: the value of the tensors its backward passes start
from (``torch.autograd.backward``, which ``Tensor.backward``, ``accelerator.backward``,
Lightning's closure and the HF Trainer all call; seen through ``intercept.py``), before a
GradScaler's scaling. One record per root; the sampler adds a step's up (each micro-batch's
share of the step's loss, ``_engine/assemble/steps.py``). ``mon.log(loss=...)`` comes first.

Most loops log the loss themselves, often after ``optimizer.step()``, so a root is only kept
until the step has ended and the loop has had its chance to log; it is read (on an
accelerator, one more device-to-host copy and event) only when the loop did not log a loss for
that step: at the next micro-batch, or at ``flush()``/``close()``. It is kept as it is, not
detached (a torch call at every backward): the backward pass frees the graph's saved tensors,
and what is left of the graph is a few small nodes the loop's own ``loss`` holds too. A
backward asked to keep its graph (``retain_graph``, ``create_graph``) keeps its saved
tensors: that root is detached, and so is the root of a backward that raised (out of memory,
an interrupt: its graph was not freed), so that nbmonitor never holds a graph's memory.

Under a framework that divides each micro-batch's loss by its configured accumulation count
(``frameworks.py``: Lightning, Accelerate), a step that ended with fewer roots than that count
(an epoch's last) has each root scaled by count/roots when it is read, so that the step's sum
is the mean of its micro-batches' losses, as the framework reports it.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable

import torch

from nbmonitor._capture.device_value import DeviceValue
from nbmonitor._capture.probes.base import StepContext
from nbmonitor.records import FROM_BACKWARD, LogRecord, Pending


class BackwardLoss:
    """Reads the roots of the backward passes of one step clock's steps."""

    __slots__ = (
        "_accumulation",
        "_ctx",
        "crossed",
        "kept",
        "last_scaled",
        "logged_step",
        "pending",
    )

    def __init__(self, ctx: StepContext, accumulation: Callable[[], int] | None = None) -> None:
        self._ctx = ctx
        # The count a framework divides each micro-batch's loss by, or None (frameworks.py).
        self._accumulation = accumulation
        # The last GradScaler.scale(loss): its result (weakly) and the loss, detached so that
        # no autograd graph is kept. (Read by the clock: a backward's usual case, written out
        # in StepClock.backward_called, is one with none.)
        self.last_scaled: tuple[weakref.ref[torch.Tensor], torch.Tensor] | None = None
        # Roots not read yet: (step, root, its version when the backward started).
        # A deque: the training thread appends, and release() may run on a flushing thread.
        # Tested for truth at every forward (empty: nothing to release).
        self.pending: collections.deque[tuple[int, torch.Tensor, int]] = collections.deque()
        # The roots the last backward started from, kept with their graph (see failed()); set
        # here and by StepClock.backward_called (started()'s usual case, written out).
        self.kept = 0
        # The last step mon.log(loss=...) gave a loss for: its roots are not needed (set by
        # the clock's log(), an attribute: no call at each step; the clock drops that step's
        # roots from ``pending`` there, so that the next forward has nothing to release).
        self.logged_step = -1
        # The root that crossed to the host with its step's norms (CUDA: StepClock._cross),
        # and where: read from there, with no copy of its own.
        self.crossed: tuple[torch.Tensor, Pending] | None = None

    def sole_root(self, step: int) -> torch.Tensor | None:
        """The one root ``step``'s backward started from, if it had one and it is a real
        scalar unchanged since (what a loop logs as its loss: the clock crosses it with the
        step's norms); None otherwise. Reads only the tensor's metadata."""
        pending = self.pending
        if len(pending) != 1:
            return None
        at, root, version = pending[0]
        if at != step or root.numel() != 1 or root._version != version:  # noqa: SLF001
            return None
        if root.is_meta or root.is_complex() or not root.is_floating_point():
            return None
        return root

    def scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        """``GradScaler.scale(loss)`` returned ``scaled``."""
        if loss.numel() == 1:
            self.last_scaled = (weakref.ref(scaled), loss.detach())

    def started(self, tensors: object, keeps_graph: bool = False) -> None:
        """A backward pass starts from ``tensors`` (with no gradient given); ``keeps_graph``:
        it keeps its graph (the roots are then detached)."""
        self.kept = 0
        if isinstance(tensors, torch.Tensor) and self.last_scaled is None:
            # One root and no GradScaler (most loops), written out: whether it is a loss (one
            # real value on a real device) is asked only if it is read (release()), since a
            # loop that logs its loss has it dropped unread. (A backward from a root of
            # several values and no gradient raises: failed() then detaches it.)
            ctx = self._ctx
            step = ctx.step + 1 if ctx.micro else ctx.step  # ctx.log_step, inline
            if step == self.logged_step:
                return
            pending = self.pending
            if pending and pending[0][0] != step:
                self.release(step - 1)
            kept = tensors.detach() if keeps_graph else tensors
            pending.append((step, kept, kept._version))  # noqa: SLF001
            self.kept = 0 if keeps_graph else 1
            return
        roots = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
        if not isinstance(roots, (tuple, list)):
            return
        scaled, self.last_scaled = self.last_scaled, None
        values = []
        for root in roots:
            if not isinstance(root, torch.Tensor) or root.numel() != 1:
                return  # not a loss (a non-scalar root needs a gradient)
            if root.is_meta or root.is_complex():
                return
            values.append(scaled[1] if scaled is not None and scaled[0]() is root else root)
        ctx = self._ctx
        step = ctx.step + 1 if ctx.micro else ctx.step  # ctx.log_step, inline
        if step == self.logged_step:
            return  # the loop logged this step's loss already
        if self.pending and self.pending[0][0] != step:
            self.release(step - 1)  # an earlier step's, not released by a forward
        for value in values:
            # detach() is a view (no device work); the version, shared with the view, tells an
            # in-place change since.
            kept = value.detach() if keeps_graph else value
            self.pending.append((step, kept, kept._version))  # noqa: SLF001  (torch's in-place counter)
        self.kept = 0 if keeps_graph else len(values)

    def failed(self) -> None:
        """The backward raised (out of memory, an interrupt) before freeing its graph: its
        roots are detached, so that nbmonitor holds none of the graph's memory (what
        ``mon.free_oom()`` frees)."""
        kept, self.kept = self.kept, 0
        pending = self.pending
        for i in range(max(0, len(pending) - kept), len(pending)):
            step, root, version = pending[i]
            pending[i] = (step, root.detach(), version)

    def release(self, through: int | None = None) -> None:
        """Record the roots of the steps up to ``through`` (all: None) the loop logged no loss
        for; drop those it did."""
        pending = self.pending
        recorder = self._ctx.recorder
        group, factor = -1, 1.0
        while pending:
            step = pending[0][0]
            if through is not None and step > through:
                return
            if step != group and self._accumulation is not None:
                group, factor = step, self._short_step_factor(step)
            try:
                step, value, version = pending.popleft()
            except IndexError:  # emptied by another thread between the check and the pop
                return
            if step == self.logged_step or value._version != version:  # noqa: SLF001
                continue  # logged by the loop; or changed in place, its value then unknown
            if value.numel() != 1 or value.is_meta or value.is_complex():
                continue  # not a loss (started() asks only here of a root alone)
            if factor != 1.0 and step == group:
                value = value.detach() * factor  # a short step's (no sync: a device op)
            record = LogRecord(step, source=FROM_BACKWARD)
            crossed = self.crossed
            if crossed is not None and value is crossed[0]:
                record.tensors.append((("loss",), crossed[1]))
            else:
                record.tensors.append((("loss",), DeviceValue(value)))
            recorder.put(record)

    def _short_step_factor(self, step: int) -> float:
        """count/roots for an ended ``step`` with fewer roots than the framework's configured
        accumulation count, else 1 (a full step's roots already add up to the mean)."""
        if self._accumulation is None or step > self._ctx.step:
            return 1.0  # no framework, or the step is still under way (a flush)
        try:
            count = self._accumulation()
        except Exception:  # a framework object in an odd state: the sum as it is
            return 1.0
        roots = sum(1 for entry in tuple(self.pending) if entry[0] == step)
        return count / roots if 0 < roots < count else 1.0
