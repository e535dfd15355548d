"""``mon.memory``: a live run's memory, and its out-of-memory errors.

One object per monitor: what holds memory now (``mon.memory()``, read from the tensors while
the model lives, else the newest breakdown the sampler published), the CUDA allocator's
history (``memory_history=True``: ``snapshot()``), an out-of-memory error's report and the
card under a notebook cell (``oom.py`` builds them), and freeing what such an error holds
(``free_oom()``). The ``Monitor`` builds it, starts it after its own start and closes it in
its own ``close()``; ``mon.free_oom()``, ``mon.memory_snapshot()`` and ``mon.oom_report()``
call it. Caller's thread only (the kernel's callback runs on the main thread after a cell);
it holds the model and the probe weakly, so that a dropped model still closes its run.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nbmonitor._capture.probes.memory import MemoryProbe
from nbmonitor._engine.run_model import RunModel
from nbmonitor.errors import ErrorLog
from nbmonitor.live import oom
from nbmonitor.live.memory_history import MemoryHistory
from nbmonitor.memory import Freed, MemoryBreakdown, OomReport


class RunMemory:
    """What holds this run's memory, and its out-of-memory errors: ``mon.memory``.

    Called, it is the breakdown now: ``mon.memory()`` (see :meth:`breakdown`). Its other
    members: ``free_oom()``, ``snapshot(path)``, ``oom_report(exc)`` and ``recording``
    (``mon.free_oom()``, ``mon.memory_snapshot(path)`` and ``mon.oom_report(exc)`` are the
    same calls). The monitor builds it, starts it and closes it; reach it as ``mon.memory``.
    See docs/memory.md.
    """

    def __init__(
        self,
        *,
        probe: MemoryProbe,
        model: torch.nn.Module,
        run: RunModel,
        history: MemoryHistory | None,
        errors: ErrorLog,
        step: Callable[[], int],
        optimizer: Callable[[], torch.optim.Optimizer | None],
        run_dir: Path,
        backend: str,
        device_index: int | None,
    ) -> None:
        # Weakly: the model's hooks hold the probe, and a model collected closes its run.
        self._probe = weakref.ref(probe)
        self._model = weakref.ref(model)
        self._run = run
        self._history = history
        self._errors = errors
        self._step = step
        self._optimizer = optimizer
        self._run_dir = run_dir
        self._backend = backend
        self._device_index = device_index

    def __call__(self) -> MemoryBreakdown:
        """The breakdown now (``mon.memory()``): the same as :meth:`breakdown`."""
        return self.breakdown()

    def breakdown(self) -> MemoryBreakdown:
        """What holds memory now: parameters, buffers, gradients and optimizer state by
        category, top-level module and dtype (exact, from the tensors), and the activations
        saved for backward on the newest sampled step. Once the model is gone, the newest
        breakdown the run published. See ``nbmonitor.memory``."""
        probe = self._probe()
        if probe is not None:
            return probe.now(self._step())
        published = self._run.memory
        return published if published is not None else MemoryBreakdown(())

    @property
    def recording(self) -> bool:
        """Whether the CUDA allocator's history is being recorded (``memory_history=True``,
        from the monitor's start to its close), so that :meth:`snapshot` can write it."""
        return self._history is not None and self._history.on

    def free_oom(self) -> Freed:
        """After an out-of-memory error in a notebook: drop what the stored error still holds
        (``sys.last_traceback`` and friends, IPython's last result and output history, the
        error's frames), collect, empty the allocator's cache, and say how much came back, so
        that the next cell runs without restarting the kernel. See docs/memory.md."""
        index = self._device_index if self._backend == "cuda" else None
        return oom.free_oom(ipython(), index)

    def snapshot(self, path: str | Path) -> Path:
        """With ``attach(..., memory_history=True)`` on CUDA: write the allocator's history
        (segments, and the recent allocations with their stacks) to ``path``, a pickle that
        https://pytorch.org/memory_viz opens. RuntimeError without the history on."""
        if self._history is None:
            raise RuntimeError(
                "nbmonitor: memory_snapshot() needs attach(..., memory_history=True) on CUDA."
            )
        return self._history.dump(path)

    def oom_report(self, exc: BaseException) -> OomReport:
        """The report the card under a cell shows, for an out-of-memory error caught in a
        script: what was being allocated and where, what held memory, what to change
        (``nbmonitor.memory.OomReport``). ValueError for an error that is not one.

        >>> try: step()  # doctest: +SKIP
        ... except torch.OutOfMemoryError as exc: report = mon.memory.oom_report(exc)
        """
        kind = oom.oom_kind(exc)
        if kind is None:
            raise ValueError(
                f"nbmonitor: oom_report() takes an out-of-memory error, got {type(exc).__name__}"
            )
        step = self._step()
        snapshot = None
        if self.recording and kind == "cuda":
            try:  # taken at the failure: the allocations that led to it are in it
                snapshot = str(self.snapshot(self._run_dir / f"oom-step{step + 1}.pickle"))
            except Exception as failure:
                self._errors.add("memory_history", failure)
        report = oom.build_report(
            exc,
            kind,
            model=self._model(),
            optimizer=self._optimizer(),
            run=self._run,
            breakdown=self.breakdown(),
            step=step,
            device_index=self._device_index,
        )
        return dataclasses.replace(report, snapshot=snapshot)

    def start(self, watch: bool) -> None:
        """The monitor's ``start()`` calls this once its hooks are in: the allocator's history
        starts recording (``memory_history=True``), and with ``watch`` (the display rank, in a
        kernel) a card shows under any cell that ends in an out-of-memory error. What fails is
        one line in ``mon.errors``; training goes on."""
        if self._history is not None:
            try:
                self._history.start()
            except Exception as exc:  # recording off: the run goes on without snapshots
                self._errors.add("memory_history", exc)
        if watch:
            self._watch()

    def close(self) -> None:
        """The monitor's ``close()`` calls this: the allocator's history stops recording if
        this run turned it on. Idempotent; never raises."""
        if self._history is not None:
            try:
                self._history.stop()
            except Exception as exc:  # close never raises
                self._errors.add("memory_history", exc)

    def _watch(self) -> None:
        """In a kernel, a card under any cell that ends in an out-of-memory error."""
        shell = ipython()
        if shell is None:
            return
        from nbmonitor.ui.oom_card import show_card

        ref = weakref.ref(self)  # the kernel's callback must not keep this run alive
        errors = self._errors  # holds no run

        def report(exc: BaseException) -> OomReport | None:
            memory = ref()
            return memory.oom_report(exc) if memory is not None else None

        def free() -> object:
            memory = ref()
            return memory.free_oom() if memory is not None else oom.free_oom(ipython(), None)

        def failed(exc: Exception) -> None:
            errors.add("oom_card", exc)

        try:
            oom.watch(report, lambda card: show_card(card, free), failed, shell)
        except Exception as exc:  # a shell without events: no card, training goes on
            self._errors.add("oom_card", exc)


def ipython() -> Any:
    """The kernel's shell when this runs in a notebook, else None."""
    from nbmonitor.ui.notebook import in_notebook

    if not in_notebook():
        return None
    from IPython.core.getipython import get_ipython

    return get_ipython()  # type: ignore[no-untyped-call, unused-ignore]
