"""The read API of a live monitor: what the sampler published at its last tick, never
waiting for it (a hung source cannot hold these up)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from nbmonitor._engine.frame import Frame
from nbmonitor._engine.pipeline import Pipeline
from nbmonitor._engine.published import history
from nbmonitor.health import Alert

# How long flush() and frame() wait for the sampler (a hung source cannot hold them longer).
FLUSH_TIMEOUT_S = 5.0


class MonitorReads:
    """Mixed into ``Monitor``: the reads of ``_pipeline``'s published state."""

    _pipeline: Pipeline

    def history(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per-step columns (step, time, loss, lr, grad_norm, step_time, samples_per_s, ...).

        As of the sampler's last tick (call ``flush()`` first for every step up to now). Long
        runs keep recent steps at full resolution and older ones as bucket means; the run log
        on disk keeps every step.
        """
        pipeline = self._pipeline
        return history(pipeline.steps, pipeline.published)

    def system(self) -> dict[str, npt.NDArray[np.float64]]:
        """System samples (time, step, cpu_percent, ram_used_bytes, ...), one row per tick."""
        return self._pipeline.system.history()

    def events(self) -> list[Alert]:
        """Alerts raised so far, oldest first (as of the sampler's last tick)."""
        return list(self._pipeline.published.alerts)

    def layers(self, as_dataframe: bool = False) -> Any:
        """One row per layer: name, shape, numel, dtype, device, requires_grad, in_optimizer,
        latest grad_norm, param_norm, update_ratio and flags (the alert rules that named it).

        As of the last health check or flush (call ``flush()`` first for the newest). Returns
        a list of dicts, or a pandas DataFrame with ``as_dataframe=True``.
        """
        rows = [dict(row) for row in self._pipeline.published.layer_table]
        if as_dataframe:
            try:
                import pandas as pd
            except ImportError as exc:
                raise ImportError(
                    "nbmonitor: layers(as_dataframe=True) needs pandas; pip install pandas."
                ) from exc
            return pd.DataFrame(rows)
        return rows

    def frame(self, detail: bool = True) -> Frame:
        """The snapshot the views show now (see ``nbmonitor._engine.frame.Frame``).

        Built between two sampler ticks: it waits for a tick in progress at most
        ``FLUSH_TIMEOUT_S`` and then raises ``TimeoutError`` (a source is hung) rather than
        hang the caller.
        """
        pipeline = self._pipeline
        if not pipeline.lock.acquire(timeout=FLUSH_TIMEOUT_S):
            raise TimeoutError(
                "nbmonitor: the sampler is stuck in a source (see mon.errors); no frame now."
            )
        try:
            return pipeline.frame(detail)
        finally:
            pipeline.lock.release()
