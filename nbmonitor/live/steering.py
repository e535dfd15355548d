"""Steering a live run (part of the live entrance): the Monitor's ``pause()``, ``resume()``,
``stop()``, ``checkpoint()`` and ``set_lr()``, the sampler's side (the control directory read
each tick, the steering events turned into alerts), and how a stop ends the user's loop: one
line and no traceback in a notebook (IPython's custom exception handler), a clean exit in a
script (``StopTrainingExit``, a ``SystemExit`` with status 0). See docs/steering.md.

The core (``_capture/steer.py``) applies the requests on the training thread; nothing here
holds the model.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from nbmonitor._capture.steer import Steering
from nbmonitor.errors import ErrorLog, StopTraining, StopTrainingExit
from nbmonitor.health.alert import Alert
from nbmonitor.runs.control import ControlReader, ControlRequest, make_control_dir
from nbmonitor.runs.job_control import JobReader
from nbmonitor.runs.text import printable

# The rule name of a steering event in the run's events (events.jsonl, ``mon.events()``, the
# frame's alerts): ``evidence`` holds ``action``, ``value``, ``source`` (and ``ok``).
RULE = "steer"

_log = logging.getLogger("nbmonitor")


class SteerPort:
    """What the sampler calls each tick (``PipelineParts.steer``): ``poll`` reads the control
    directory (on a source's worker: file I/O), ``take`` turns the steering events into
    alerts. Holds the Steering weakly: the sampler must not keep the user's scheduler."""

    def __init__(
        self,
        steering: Steering,
        reader: ControlReader | None,
        errors: ErrorLog,
        job: JobReader | None = None,
    ) -> None:
        self._steering = weakref.ref(steering)
        # The run's own control folder, then (a rank of a job) the job's (job_control.py).
        self._readers: tuple[ControlReader | JobReader, ...] = tuple(
            r for r in (reader, job) if r is not None
        )
        self._errors = errors

    def poll(self) -> None:
        steering = self._steering()
        if steering is None:
            return
        for reader in self._readers:
            self._poll(reader, steering)

    def _poll(self, reader: ControlReader | JobReader, steering: Steering) -> None:
        for got in reader.poll():
            if isinstance(got, ControlRequest):
                at_step = got.at_step if got.at_step is not None else None
                steering.request(
                    got.kind,
                    got.value,
                    source=printable(got.source, limit=40),
                    at_step=at_step,  # type: ignore[arg-type]  # checked by request()
                )
            else:
                steering.refuse(
                    "control",
                    f"control file {printable(got.file, limit=80)} {got.why}",
                )

    def take(self) -> list[Alert]:
        steering = self._steering()
        if steering is None:
            return []
        return [
            Alert(
                RULE,
                "info" if e.ok else "warning",
                _message(e.message, e.source, e.ok, e.late),
                e.step,
                e.time,
                evidence={
                    "action": e.action,
                    "value": e.value if isinstance(e.value, (int, float, str)) else None,
                    "source": e.source,
                    "ok": e.ok,
                },
            )
            for e in steering.take_events()
        ]


def _message(text: str, source: str, ok: bool, late: bool = False) -> str:
    first = text[:1].upper() + text[1:]
    if late:
        return f"{first} (asked from {source})."
    if ok:
        return f"{first} (asked from {source})."
    return f"A steering request was refused: {text} (from {source})."


def build_steering(
    clock: Any,
    model: Any,
    errors: ErrorLog,
    run_dir: Path,
    *,
    scheduler: Any,
    on_checkpoint: Callable[[Path, int], object] | None,
    control: bool,
    job: Callable[[Steering], JobReader | None] | None = None,
) -> tuple[Steering, SteerPort]:
    """The steering of a run and its sampler's port; ``control``: read ``run_dir/control/``
    (made here); ``job``: makes a rank's reader of its job's requests for the steering
    (``job_steering.py``)."""
    steering = Steering(
        clock,
        errors,
        model=model,
        scheduler=scheduler,
        on_checkpoint=on_checkpoint,
        checkpoint_dir=run_dir / "checkpoints",
    )
    steering.stop_error = stop_error
    reader = None
    if control:
        try:
            make_control_dir(run_dir)
            reader = ControlReader(run_dir)
        except OSError as exc:  # steered from Python and the dashboard only
            errors.add("steer", exc)
    job_reader = job(steering) if job is not None else None
    return steering, SteerPort(steering, reader, errors, job_reader)


class _Closes(Protocol):
    def close(self) -> None: ...


def on_stop(monitor: _Closes) -> Callable[[int], None]:
    """What a stop does before it is raised (on the training thread, at the step's end): close
    the run (status ``stopped``), so that it is closed however the loop ends. The monitor is
    held weakly."""
    ref = weakref.ref(monitor)

    def close(step: int) -> None:
        mon = ref()
        if mon is not None:
            mon.close()

    return close


def stop_error(step: int) -> BaseException:
    """What a stop raises in the loop: in the main thread of a script a ``StopTrainingExit``,
    a ``SystemExit`` with status 0 (the script exits cleanly); elsewhere a ``StopTraining``:
    under IPython the cell ends with one line (``install_handler``), in a thread the thread
    ends without a traceback (``_quiet_threads``)."""
    message = f"nbmonitor: training stopped at step {step}"
    if threading.current_thread() is not threading.main_thread():
        _quiet_threads()
        return StopTraining(message, step)
    if _shell() is not None:
        return StopTraining(message, step)
    if hasattr(sys, "ps1"):  # Python's own prompt: one line there too
        _quiet_prompt()
        return StopTraining(message, step)
    _log.warning("%s (as asked); exiting", message.removeprefix("nbmonitor: "))
    return StopTrainingExit(message, step)


def _quiet_prompt() -> None:
    """At Python's own prompt a stop prints one line, not a traceback: ``sys.excepthook``
    wrapped, chained with the one set. Once, at the first stop raised there."""
    previous = sys.excepthook
    if getattr(previous, "nbmonitor_quiet", False):
        return

    def hook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
        if isinstance(value, StopTraining):
            print(str(value), file=sys.stderr)
            return
        previous(etype, value, tb)

    hook.nbmonitor_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _quiet_threads() -> None:
    """A thread that a stop ends, ends silently, as with a ``SystemExit`` (threading's own hook
    lets only that exact class through): ``threading.excepthook`` wrapped, chained with the
    one set. Once, at the first stop raised in a thread."""
    previous = threading.excepthook
    if getattr(previous, "nbmonitor_quiet", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, StopTraining):
            return
        previous(args)

    hook.nbmonitor_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:
        return None


_installed: list[Any] = []  # the shell the handler is installed in (once per process)


def install_handler() -> None:
    """In IPython: a ``StopTraining`` that ends a cell prints one line (no traceback) and the
    cell counts as finished (its reply is "ok": a queued cell after it runs). Chained with a
    custom exception handler already set. Once per shell; never raises."""
    shell = _shell()
    if shell is None or any(s is shell for s in _installed):
        return
    try:
        previous = tuple(getattr(shell, "custom_exceptions", ()) or ())
        previous_handler = getattr(shell, "CustomTB", None) if previous else None

        def handler(
            shell: Any,
            etype: type[BaseException],
            value: BaseException,
            tb: Any,
            tb_offset: Any = None,
        ) -> list[str]:
            if isinstance(value, StopTraining):
                print(str(value), flush=True)
                return []
            if previous_handler is not None:
                previous_handler(etype, value, tb, tb_offset=tb_offset)
            return []

        shell.set_custom_exc((StopTraining, *previous), handler)

        def after_cell(result: Any) -> None:
            if isinstance(getattr(result, "error_in_exec", None), StopTraining):
                result.error_in_exec = None  # the stop asked for: the cell finished

        shell.events.register("post_run_cell", after_cell)
        _installed.append(shell)
    except Exception as exc:  # a shell without these: the stop shows IPython's traceback
        _log.debug("nbmonitor: no stop handler in this shell: %s", exc)


__all__ = [
    "RULE",
    "SteerPort",
    "build_steering",
    "install_handler",
    "on_stop",
    "stop_error",
]
