"""``mon.profile()``: ``torch.profiler`` over the next few steps, on the training thread's own
schedule, and its ``key_averages`` table.

The step clock calls ``ProfileRun.step_ended`` at the end of every step (``step_listeners``):
the profiler starts at the first step boundary after ``profile()`` (so every profiled step is
whole), advances with ``torch.profiler.schedule`` (``wait`` steps, ``warmup`` steps, then
``steps`` recorded ones) and stops as the last recorded step ends. Reading the events into
the table and writing the trace are left to a short-lived thread (``nbmonitor-profile``), not
the training thread. CPU activity always; CUDA activity when the model trains on CUDA. Stopping
the profiler synchronises the GPU once, as ``torch.profiler`` does.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch._C._autograd import _profiler_enabled
from torch.profiler import ProfilerActivity, profile, schedule

from nbmonitor._atomic import atomic_path, write_atomic
from nbmonitor.errors import ErrorLog

# Rows kept in the table (the costliest by self device time on CUDA, else self CPU time); the
# text table and the trace file on disk keep every operator.
MAX_ROWS = 100
MAX_STEPS = 1000

# (key, label, kind) of the table's columns; times in milliseconds, memory in bytes.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("name", "operator", "text"),
    ("calls", "calls", "int"),
    ("self_cpu_ms", "self CPU (ms)", "num"),
    ("cpu_ms", "CPU total (ms)", "num"),
    ("self_device_ms", "self device (ms)", "num"),
    ("device_ms", "device total (ms)", "num"),
    ("self_cpu_memory_bytes", "self CPU memory", "bytes"),
    ("self_device_memory_bytes", "self device memory", "bytes"),
)


class ProfilerBusy(RuntimeError):
    """Another torch profiler runs: ours would stop it as it ends. Not nbmonitor's failure."""


def check_profile_args(steps: object, wait: object, warmup: object) -> None:
    """One-line errors for ``mon.profile()``'s arguments."""
    for name, value, low in (("steps", steps, 1), ("wait", wait, 0), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_STEPS:
            raise ValueError(
                f"nbmonitor: profile({name}=...) must be an int from {low} to {MAX_STEPS}, got "
                f"{value!r}; e.g. mon.profile(steps=3, wait=1, warmup=1)."
            )


@dataclass
class ProfileResult:
    """What a finished profile shows: the table rows, the trace written, or why it failed."""

    first_step: int = 0  # the steps recorded, first to last
    last_step: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    table_text: str = ""
    trace_path: Path | None = None
    error: str | None = None
    cancelled: bool = False


@contextlib.contextmanager
def _quiet_cycle_warning() -> Iterator[None]:
    """torch warns at a schedule's start that events are cleared between cycles: the schedule
    here has one cycle, so the warning says nothing to the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each")
        yield


class ProfileRun:
    """One ``mon.profile()`` call: waits for a step boundary, profiles, hands the result on.

    ``step_ended`` runs on the training thread (the step clock's listener); ``on_done`` runs
    once, on the ``nbmonitor-profile`` thread (or the caller's, for a failure or cancel).
    """

    def __init__(
        self,
        *,
        steps: int,
        wait: int,
        warmup: int,
        cuda: bool,
        out_dir: Path,
        errors: ErrorLog,
        on_done: Callable[[ProfileResult], None],
        detach: Callable[[ProfileRun], None],
    ) -> None:
        self.steps, self.wait, self.warmup = steps, wait, warmup
        self.cuda = cuda
        self.out_dir = out_dir
        self._errors = errors
        self._on_done = on_done
        self._detach = detach
        self._lock = threading.Lock()
        self._prof: Any = None
        self._started = False  # torch's start() returned: stopping it is safe
        self._trace_ready = False
        self._first_step = 0
        self._thread: threading.Thread | None = None
        self.state = "waiting"  # waiting | profiling | processing | done
        self.result: ProfileResult | None = None
        self.finished = threading.Event()

    # -- the training thread ------------------------------------------------------------------

    def step_ended(self, step: int) -> None:
        """At the end of ``step``: start, advance or stop the profiler. Never raises."""
        with self._lock:
            try:
                if self.state == "waiting":
                    self._start(step)
                elif self.state == "profiling":
                    with _quiet_cycle_warning():
                        self._prof.step()
                    if self._trace_ready:
                        self._stop(step)
            except Exception as exc:
                self._fail(f"profile failed at step {step}: {type(exc).__name__}: {exc}", exc)

    def _start(self, step: int) -> None:
        if profiler_enabled():
            raise ProfilerBusy("another torch profiler is running; stop it first")
        activities = [ProfilerActivity.CPU]
        if self.cuda:
            activities.append(ProfilerActivity.CUDA)
        # The steps recorded are those after the wait and warmup steps.
        self._first_step = step + self.wait + self.warmup + 1
        with warnings.catch_warnings():
            # torch warns that a schedule without warmup skews the first step: the user chose.
            warnings.simplefilter("ignore", UserWarning)
            plan = schedule(wait=self.wait, warmup=self.warmup, active=self.steps, repeat=1)
        self._prof = profile(
            activities=activities,
            schedule=plan,
            on_trace_ready=self._ready,
            profile_memory=True,
        )
        with _quiet_cycle_warning():
            self._prof.start()
        self._started = True
        self.state = "profiling"

    def _ready(self, prof: Any) -> None:
        self._trace_ready = True

    def _stop(self, step: int) -> None:
        prof, self._prof = self._prof, None
        self.state = "processing"
        self._detach(self)
        prof.stop()
        thread = threading.Thread(
            target=self._process, args=(prof, step), name="nbmonitor-profile", daemon=True
        )
        self._thread = thread
        thread.start()

    # -- any thread ---------------------------------------------------------------------------

    def cancel(self, why: str = "cancelled") -> None:
        """Stop a profile that has not finished (its profiler too); nothing is shown of it."""
        with self._lock:
            if self.state in ("processing", "done"):
                return
            prof, self._prof = self._prof, None
            self.state = "processing"
        self._stop_quietly(prof)
        self._finish(
            ProfileResult(error=f"The profile was {why} before it finished.", cancelled=True)
        )

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the result is there (or the profile failed); whether it is."""
        if not self.finished.wait(timeout):
            return False
        thread = self._thread
        if thread is not None:
            thread.join(timeout)  # it ends right after the result is set
        return True

    def _fail(self, message: str, exc: Exception) -> None:
        if not isinstance(exc, ProfilerBusy):
            self._errors.add("profile", exc)
        prof, self._prof = self._prof, None
        if not self._started:
            # torch's start() raised half-way: stopping it then starts a trace that was never
            # prepared, which crashed the process on CUDA (a segfault, seen on an H200).
            prof = None
        self.state = "processing"
        self._stop_quietly(prof)
        self._finish(ProfileResult(error=message))

    def _stop_quietly(self, prof: Any) -> None:
        """Off the step clock, and the torch profiler stopped (its failure only logged)."""
        self._detach(self)
        if prof is not None:
            try:
                prof.stop()
            except Exception as exc:
                self._errors.add("profile", exc)

    def _finish(self, result: ProfileResult) -> None:
        self.result = result
        self.state = "done"
        try:
            self._on_done(result)
        except Exception as exc:
            self._errors.add("profile", exc)
        self.finished.set()

    # -- the nbmonitor-profile thread ---------------------------------------------------------

    def _process(self, prof: Any, last_step: int) -> None:
        result = ProfileResult(self._first_step, last_step)
        try:
            events = prof.key_averages()
            result.rows = table_rows(events, device=self.cuda)
            sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
            result.table_text = events.table(sort_by=sort, row_limit=MAX_ROWS)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            stem = f"steps-{self._first_step}-{last_step}"
            trace = self.out_dir / f"{stem}.pt.trace.json"
            # Each file whole or not at all (a process killed while torch writes a trace of
            # hundreds of MB never leaves half of one for a viewer to choke on).
            with atomic_path(trace) as tmp:
                prof.export_chrome_trace(str(tmp))
            write_atomic(self.out_dir / f"{stem}.txt", result.table_text.encode("utf-8"))
            result.trace_path = trace
        except Exception as exc:
            self._errors.add("profile", exc)
            result.error = f"the profile's results could not be read: {type(exc).__name__}: {exc}"
        self._finish(result)


def table_rows(events: Any, device: bool) -> list[dict[str, Any]]:
    """The costliest operators of a ``key_averages()`` list as plain rows (``COLUMNS``)."""
    rows = []
    for event in events:
        self_device = _us(event, "self_device_time_total")
        rows.append(
            {
                "name": str(event.key),
                "calls": int(event.count),
                "self_cpu_ms": _us(event, "self_cpu_time_total") / 1e3,
                "cpu_ms": _us(event, "cpu_time_total") / 1e3,
                "self_device_ms": self_device / 1e3 if device else math.nan,
                "device_ms": _us(event, "device_time_total") / 1e3 if device else math.nan,
                "self_cpu_memory_bytes": float(getattr(event, "self_cpu_memory_usage", 0)),
                "self_device_memory_bytes": (
                    float(getattr(event, "self_device_memory_usage", 0)) if device else math.nan
                ),
            }
        )
    key = "self_device_ms" if device else "self_cpu_ms"

    def cost(row: dict[str, Any]) -> float:
        value = float(row[key])
        return -value if math.isfinite(value) else 0.0

    rows.sort(key=cost)
    return rows[:MAX_ROWS]


def _us(event: Any, name: str) -> float:
    value = getattr(event, name, 0.0)
    return float(value) if value is not None else 0.0


def profiler_enabled() -> bool:
    """Whether a torch profiler records now (the user's own, or one of ours)."""
    return bool(_profiler_enabled())


def profile_dir(run_dir: Path) -> Path:
    """Where a run's profiles go."""
    return run_dir / "profiles"
