"""Rules on accelerators (GPU temperature, memory pressure, throttling, idling), over recent
system-sample columns. Subject: the device, ``gpu(i)`` (``"gpu0"``) or ``"mps"``.

The functions read a mapping of numpy arrays keyed like the backend's sample keys (plus
``step`` and, when present, ``time``), oldest first, and return the alerts that hold *now*;
they keep no state and can be used alone. The rule classes wrap them for ``Health``, which
raises each (rule, device) once per episode.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from nbmonitor._clock_events import THROTTLING_MASK, decode_throttle
from nbmonitor.health import alert as subjects
from nbmonitor.health.alert import Alert
from nbmonitor.health.doc import FINDING, RuleDoc
from nbmonitor.health.rule import Base, Outcome, always, nothing
from nbmonitor.health.thresholds import IDLE_UTIL_PERCENT, MEMORY_FRACTION, TEMPERATURE_C
from nbmonitor.health.view import HealthView

Columns = Mapping[str, npt.NDArray[np.float64]]

IDLE_WINDOW = 20  # samples: 10 s at the default 0.5 s interval

# Metric keys, not messages: a GPU's index is the number in its keys' prefix.
_GPU_KEY = re.compile(r"^gpu(\d+)_util_percent$")
_HARD_THROTTLE = 0x008 | 0x020 | 0x040 | 0x080  # hw slowdown, sw/hw thermal, power brake


def gpu_indices(columns: Columns) -> list[int]:
    """The GPU indices that have columns, in order."""
    return list(_gpu_indices(tuple(columns)))


@functools.lru_cache(maxsize=8)
def _gpu_indices(keys: tuple[str, ...]) -> tuple[int, ...]:
    # The same keys every sample (four device rules a pass read them): matched once.
    found = (_GPU_KEY.match(key) for key in keys)
    return tuple(sorted(int(m.group(1)) for m in found if m))


def _last_finite(values: npt.NDArray[np.float64] | None) -> float:
    if values is None:
        return math.nan
    finite = values[np.isfinite(values)]
    return float(finite[-1]) if finite.size else math.nan


def _where(columns: Columns) -> tuple[int, float]:
    """Step and time of the newest sample, for stamping alerts."""
    step = _last_finite(columns.get("step"))
    when = _last_finite(columns.get("time"))
    return (int(step) if math.isfinite(step) else 0), when


def temperature_rule(columns: Columns, threshold_c: float = TEMPERATURE_C) -> list[Alert]:
    """A GPU at or above ``threshold_c`` is close to thermal slowdown (usually ~87-90 °C)."""
    step, when = _where(columns)
    alerts = []
    for i in gpu_indices(columns):
        temp = _last_finite(columns.get(f"gpu{i}_temperature_c"))
        if temp >= threshold_c:
            alerts.append(
                Alert(
                    "gpu_temperature",
                    "warning",
                    f"GPU {i} is at {temp:.0f} °C: it will soon slow its clocks to cool down; "
                    "check airflow and fans, or lower the power limit.",
                    step,
                    when,
                    subject=subjects.gpu(i),
                )
            )
    return alerts


def memory_rule(columns: Columns, fraction: float = MEMORY_FRACTION) -> list[Alert]:
    """Device memory at or above ``fraction`` of the total: the next large batch may OOM."""
    step, when = _where(columns)
    devices = [
        (subjects.gpu(i), f"GPU {i}", f"gpu{i}_mem_used_bytes", f"gpu{i}_mem_total_bytes")
        for i in gpu_indices(columns)
    ]
    devices.append((subjects.MPS, "MPS", "mps_allocated_bytes", "mps_recommended_max_bytes"))
    alerts = []
    for subject, label, used_key, total_key in devices:
        used = _last_finite(columns.get(used_key))
        total = _last_finite(columns.get(total_key))
        if total > 0 and used / total >= fraction:
            alerts.append(
                Alert(
                    "device_memory",
                    "warning",
                    f"{label} memory is {used / total:.0%} full ({used / 2**30:.1f} of "
                    f"{total / 2**30:.1f} GiB): a larger batch or sequence may run out of memory; "
                    "reduce the batch size or use activation checkpointing / mixed precision.",
                    step,
                    when,
                    subject=subject,
                )
            )
    return alerts


def throttle_rule(columns: Columns) -> list[Alert]:
    """Clocks held down by heat or power in the newest sample (from the clock-event mask)."""
    step, when = _where(columns)
    alerts = []
    for i in gpu_indices(columns):
        mask = _last_finite(columns.get(f"gpu{i}_throttle_mask"))
        if not math.isfinite(mask):
            continue
        active = int(mask) & THROTTLING_MASK
        if not active:
            continue
        reasons = ", ".join(decode_throttle(active))
        if active & _HARD_THROTTLE:
            severity = "warning"
            hint = "the GPU is too hot or its power supply is limiting it; check cooling."
        else:
            # Only the software power cap: common at full load, and it costs a little speed.
            severity = "info"
            hint = "it is running at its power limit, which is normal under full load."
        alerts.append(
            Alert(
                "gpu_throttling",
                severity,
                f"GPU {i} clocks are reduced ({reasons}): {hint}",
                step,
                when,
                subject=subjects.gpu(i),
            )
        )
    return alerts


def idle_rule(
    columns: Columns,
    window: int = IDLE_WINDOW,
    threshold_percent: float = IDLE_UTIL_PERCENT,
    gpus: Iterable[int] | None = None,
) -> list[Alert]:
    """A training GPU mostly idle over the last ``window`` samples while steps advanced.

    Only judged on a full window, so the first seconds (warm-up, compilation) do not count;
    ``gpus`` restricts it to the devices the model trains on (other visible GPUs are idle by
    right).
    """
    steps = columns.get("step")
    if steps is None or len(steps) < window:
        return []
    recent_steps = steps[-window:]
    finite_steps = recent_steps[np.isfinite(recent_steps)]
    if finite_steps.size < 2 or finite_steps[-1] <= finite_steps[0]:
        return []  # paused, evaluating or finished: an idle GPU is expected
    step, when = _where(columns)
    chosen = set(gpu_indices(columns) if gpus is None else gpus)
    alerts = []
    for i in gpu_indices(columns):
        if i not in chosen:
            continue
        util = columns[f"gpu{i}_util_percent"][-window:]
        util = util[np.isfinite(util)]
        if util.size < window // 2:
            continue  # too few readings to judge
        mean = float(util.mean())
        if mean < threshold_percent:
            alerts.append(
                Alert(
                    "gpu_idle",
                    "warning",
                    f"GPU {i} averaged {mean:.0f}% utilisation over the last {window} samples "
                    "while training: input-bound? check DataLoader num_workers / pin_memory, "
                    "or increase the batch size.",
                    step,
                    when,
                    subject=subjects.gpu(i),
                )
            )
    return alerts


def check(columns: Columns, gpus: Iterable[int] | None = None) -> list[Alert]:
    """Every device rule with its default threshold."""
    return [
        *temperature_rule(columns),
        *memory_rule(columns),
        *throttle_rule(columns),
        *idle_rule(columns, gpus=gpus),
    ]


class _DeviceRule(Base):
    """A device function as a rule: it looks at every device each time, so every device is
    judged, and it holds for the devices it raised an alert for."""

    def _alerts(self, view: HealthView, system: Columns) -> list[Alert]:
        raise NotImplementedError

    def check(self, view: HealthView) -> Outcome:
        system = view.inp.system
        if not system or not any(len(v) for v in system.values()):
            return nothing(self.name)
        found: dict[str, Alert] = {}
        for alert in self._alerts(view, system):
            found.setdefault(alert.subject, alert)
        return Outcome(self.name, list(found), always, lambda new: [found[s] for s in new])


class GpuTemperature(_DeviceRule):
    name = "gpu_temperature"
    doc = RuleDoc(
        FINDING,
        "a GPU at 85 °C or more: it will soon slow its clocks",
        "the GPU's temperature in the recent system samples",
        "check the cooling and the airflow",
        (),
    )

    def _alerts(self, view: HealthView, system: Columns) -> list[Alert]:
        return temperature_rule(system, self.thresholds.temperature_c)


class DeviceMemory(_DeviceRule):
    name = "device_memory"
    doc = RuleDoc(
        FINDING,
        "GPU (or MPS) memory 95 % full or more: a larger batch or sequence runs out",
        "the device's used memory against its total in the recent samples",
        "lower the batch size, use mixed precision or gradient checkpointing",
        (),
    )

    def _alerts(self, view: HealthView, system: Columns) -> list[Alert]:
        return memory_rule(system, self.thresholds.memory_fraction)


class GpuThrottling(_DeviceRule):
    name = "gpu_throttling"
    doc = RuleDoc(
        FINDING,
        "the GPU's clocks are held down by heat or a power brake",
        "NVML's throttle reasons in the recent samples (only the power cap: info, normal at full "
        "load)",
        "check the cooling; a power cap at full load is expected",
        ("the power cap alone at full load (info)",),
    )

    def _alerts(self, view: HealthView, system: Columns) -> list[Alert]:
        return throttle_rule(system)


class GpuIdle(_DeviceRule):
    name = "gpu_idle"
    doc = RuleDoc(
        FINDING,
        "a training GPU mostly idle while steps advance: the loop waits for its input",
        "utilisation under 30 % on average over the last 20 samples while steps advanced",
        "raise the `DataLoader`'s `num_workers`, set `pin_memory=True`, or increase the batch size",
        (),
    )

    def _alerts(self, view: HealthView, system: Columns) -> list[Alert]:
        t = self.thresholds
        return idle_rule(system, threshold_percent=t.idle_util_percent, gpus=view.inp.gpus)


# The rules a watch of the machine without a model runs (nbmonitor.devices(), nbmonitor top):
# a run's device rules, in the same order, but GpuIdle, which needs a run's steps: a run
# reports its own idle GPU in its events, and nbmonitor top judges idle_rule for the GPUs a
# followed run's process uses (nbmonitor/machine/top.py).
DEVICE_RULES = (GpuTemperature, DeviceMemory, GpuThrottling)


__all__ = [
    "DEVICE_RULES",
    "DeviceMemory",
    "GpuIdle",
    "GpuTemperature",
    "GpuThrottling",
    "check",
    "gpu_indices",
    "idle_rule",
    "memory_rule",
    "temperature_rule",
    "throttle_rule",
]
