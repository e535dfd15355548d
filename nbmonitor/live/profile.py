"""``Monitor.profile()`` put together: the training-side run (``_capture/profiler.py``), the
step clock that drives it, and where its result shows (the notebook table or the log)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nbmonitor._capture.profiler import (
    COLUMNS,
    ProfileResult,
    ProfileRun,
    check_profile_args,
    profile_dir,
    profiler_enabled,
)
from nbmonitor.errors import ErrorLog
from nbmonitor.live.lifetime import Lifetime


class Profile:
    """What ``mon.profile()`` returns: ``torch.profiler`` over the next steps, then its table.

    In a notebook it displays as a sortable table (self CPU time, device time, memory per
    operator) that fills in once the profiled steps have run; ``wait()`` blocks until then.
    The Chrome/Perfetto trace and the text table are saved under ``<run_dir>/profiles/``.
    """

    def __init__(self, run: ProfileRun, view: Any) -> None:
        self._run = run
        self._view = view

    @property
    def done(self) -> bool:
        """Whether the result is there (or the profile failed, see ``error``)."""
        return self._run.finished.is_set()

    @property
    def state(self) -> str:
        """``"waiting"`` (for a step boundary), ``"profiling"``, ``"processing"`` or ``"done"``."""
        return self._run.state

    def wait(self, timeout: float | None = 60.0) -> bool:
        """Block until the result is there, at most ``timeout`` seconds; whether it is."""
        return self._run.join(timeout)

    def cancel(self) -> None:
        """Stop the profile (and its profiler) if it has not finished."""
        self._run.cancel()

    @property
    def _result(self) -> ProfileResult:
        return self._run.result or ProfileResult()

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One dict per operator, costliest first (at most 100): ``name``, ``calls``,
        ``self_cpu_ms``, ``cpu_ms``, ``self_device_ms``, ``device_ms``,
        ``self_cpu_memory_bytes``, ``self_device_memory_bytes`` (device columns NaN without
        CUDA)."""
        return [dict(row) for row in self._result.rows]

    @property
    def steps(self) -> tuple[int, int]:
        """The first and last step recorded."""
        return self._result.first_step, self._result.last_step

    @property
    def trace_path(self) -> Path | None:
        """The Chrome trace, ``<run_dir>/profiles/steps-<first>-<last>.pt.trace.json`` (open it
        in https://ui.perfetto.dev or chrome://tracing)."""
        return self._result.trace_path

    @property
    def error(self) -> str | None:
        """Why it failed or stopped (another torch profiler running, cancelled, ``close()``),
        else None."""
        return self._result.error

    def table(self) -> str:
        """``key_averages().table()`` as torch prints it."""
        return self._result.table_text

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        if self._view is None:
            from nbmonitor.ui.panels.profile import ProfileView

            self._view = ProfileView(_columns())
            if self.done:
                _show(self._view, self._result)
        return self._view._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        first, last = self.steps
        where = f" steps {first}-{last}" if self.done and not self.error else ""
        return f"<nbmonitor.Profile {self.state}{where}>"


def _columns() -> list[dict[str, str]]:
    return [{"key": key, "label": label, "kind": kind} for key, label, kind in COLUMNS]


def _show(view: Any, result: ProfileResult) -> None:
    first, last = result.first_step, result.last_step
    if result.error:
        view.show_error(result.error)
    else:
        trace = str(result.trace_path) if result.trace_path else ""
        view.show_rows(f"torch.profiler, steps {first}-{last}", result.rows, trace)


def start_profile(
    life: Lifetime,
    errors: ErrorLog,
    run_dir: Path,
    *,
    cuda: bool,
    notebook: bool,
    steps: int,
    wait: int,
    warmup: int,
) -> Profile:
    check_profile_args(steps, wait, warmup)
    if profiler_enabled():
        raise RuntimeError(
            "nbmonitor: another torch profiler is running; stop it before mon.profile()."
        )
    clock = life.clock()
    if life.closed or clock is None:
        raise RuntimeError("nbmonitor: profile() on a closed monitor; attach again first.")
    current: Profile | None = life.profile
    if current is not None and not current.done:
        raise RuntimeError(
            f"nbmonitor: a profile is already {current.state}; wait for it (.wait()) or "
            "stop it (.cancel()) before starting another."
        )
    view: Any = None
    if notebook:
        from nbmonitor.ui.panels.profile import ProfileView

        view = ProfileView(_columns())
        total = wait + warmup
        view.show_status(
            f"torch.profiler: waiting for the next step to end, then {total} step(s) before "
            f"recording {steps}."
        )
    logger = logging.getLogger("nbmonitor")

    def done(result: ProfileResult) -> None:
        if view is not None:
            _show(view, result)
        elif result.error:
            level = logging.INFO if result.cancelled else logging.WARNING
            logger.log(level, "profile: %s", result.error)
        else:
            logger.info(
                "profile of steps %d-%d: trace %s", result.first_step, result.last_step,
                result.trace_path,
            )  # fmt: skip

    def detach(run: ProfileRun) -> None:
        if run.step_ended in clock.step_listeners:
            clock.step_listeners.remove(run.step_ended)
        if run.cancel in life.on_close:
            life.on_close.remove(run.cancel)

    run = ProfileRun(
        steps=steps,
        wait=wait,
        warmup=warmup,
        cuda=cuda,
        out_dir=profile_dir(run_dir),
        errors=errors,
        on_done=done,
        detach=detach,
    )
    life.on_close.append(run.cancel)
    clock.step_listeners.append(run.step_ended)
    handle = Profile(run, view)
    life.profile = handle
    if view is not None:
        view.display()
    return handle
