"""The console view: a compact status line every few seconds through ``logging``, for scripts."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Mapping

from nbmonitor._engine.frame import Frame

LOGGER_NAME = "nbmonitor"
# The console line fits a 100-column terminal with the handler's "nbmonitor: " before it.
LINE_WIDTH = 100
PREFIX = "nbmonitor: "


def console_logger(install_handler: bool) -> logging.Logger:
    """The ``nbmonitor`` logger; with ``install_handler`` it prints to stderr if nothing is set up.

    A user who configured logging keeps full control: a handler is added only when neither the
    ``nbmonitor`` logger nor the root logger has one.
    """
    logger = logging.getLogger(LOGGER_NAME)
    if install_handler and not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(f"{PREFIX}%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def _num(value: float | None, fmt: str) -> str:
    if value is None or not math.isfinite(value):
        return "n/a" if value is None or math.isnan(value) else str(value)
    return format(value, fmt)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "n/a"
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def clip_summary(latest: Mapping[str, float]) -> str | None:
    """How much the gradient clip acts ("clipped on 63% of recent steps, coef 0.13"), or None
    in a loop that does not clip."""
    share = latest.get("grad_clipped_fraction", math.nan)
    if not math.isfinite(share):
        return None
    text = f"clipped on {share:.0%} of recent steps"
    coef = latest.get("grad_clip_coef", math.nan)
    return text + (f", coef {coef:.3g}" if math.isfinite(coef) and coef < 1 else "")


def throughput(latest: Mapping[str, float]) -> list[str]:
    """tokens/s (samples/s without token ids); TFLOP/s and MFU once the FLOPs are counted."""
    tokens = latest.get("tokens_per_s", math.nan)
    if math.isfinite(tokens):
        parts = [f"{_num(tokens, ',.0f')} tokens/s"]
    else:
        parts = [f"{_num(latest.get('samples_per_s'), ',.0f')} samples/s"]
    tflops = latest.get("tflops_per_s", math.nan)
    if math.isfinite(tflops):
        parts.append(f"{_num(tflops, '.3g')} TFLOP/s")
        mfu = latest.get("mfu_percent", math.nan)
        parts.append(f"MFU {mfu:.1f}%" if math.isfinite(mfu) else "MFU n/a")
    return parts


def memory_summary(latest: Mapping[str, float]) -> str | None:
    """ "peak 61.2 of 79.1 GiB, batch up to 96 fits" (the estimate of _engine/derive/headroom),
    or None while the device's memory is unknown."""
    peak = latest.get("memory_peak_bytes", math.nan)
    limit = latest.get("memory_limit_bytes", math.nan)
    if not (math.isfinite(peak) and math.isfinite(limit)):
        return None
    text = f"mem peak {peak / 2**30:.3g} of {limit / 2**30:.3g} GiB"
    fits = latest.get("batch_fits", math.nan)
    batch = latest.get("batch_size", math.nan)
    if math.isfinite(fits) and math.isfinite(batch):
        more = latest.get("batch_fits_more", 0.0) == 1.0
        text += f", batch {batch:.0f} ({'over' if more else 'up to ~'}{fits:.0f} fits)"
    return text


def status_line(frame: Frame, width: int = LINE_WIDTH - len(PREFIX)) -> str:
    """One line with the numbers a person glances at, at most ``width`` characters: the parts
    that matter least (the CPU, RSS, FLOP/s and MFU, memory, lr) are left out, in that order,
    until it fits. NaN shows as n/a."""
    latest = frame.latest
    # (rank: lower is kept longer, text), in the order shown.
    parts: list[tuple[int, str]] = []
    step = f"step {frame.step}" + (f"/{frame.total_steps}" if frame.total_steps else "")
    parts += [(0, step), (1, f"loss {_num(latest.get('loss'), '.4g')}")]
    if "lr" in latest:
        parts.append((8, f"lr {_num(latest.get('lr'), '.2e')}"))
    if "grad_norm" in latest:
        share = latest.get("grad_clipped_fraction", math.nan)
        clip = f" (clipped {share:.0%})" if math.isfinite(share) else ""
        parts.append((7, f"grad {_num(latest.get('grad_norm'), '.3g')}{clip}"))
    step_time = latest.get("step_time", math.nan)
    parts.append((2, f"{_num(step_time * 1e3, '.1f')} ms/step"))
    for i, text in enumerate(throughput(latest)):
        parts.append((3 if i == 0 else 10, text))
    for i, device in enumerate(frame.devices):
        util = device.get("util_percent", math.nan)
        if isinstance(util, float):
            parts.append((6, f"GPU{i} {_num(util, '.0f')}%"))
    memory = memory_summary(latest)
    if memory:
        parts.append((9, memory))
    # The process's CPU is a share of one core (top's way): several busy cores exceed 100%.
    parts.append((12, f"CPU {_num(latest.get('process_cpu_percent'), '.0f')}% of a core"))
    ram = latest.get("process_rss_bytes", math.nan) / 2**30
    parts.append((11, f"RSS {_num(ram, '.2f')} GiB"))
    if frame.total_steps:
        parts.append((4, f"ETA {_duration(frame.eta_s)}"))
    if frame.status != "running":
        parts.append((5, frame.status))
    while len(parts) > 1 and len(" | ".join(t for _, t in parts)) > width:
        parts.remove(max(parts, key=lambda part: part[0]))
    return " | ".join(t for _, t in parts)


def summary_text(frame: Frame) -> str:
    """The closing summary: steps, time, last and best loss, throughput, errors."""
    latest = frame.latest
    lines = [
        f"run {frame.run} ({frame.backend}) {frame.status}: {frame.step} steps in "
        f"{_duration(frame.elapsed_s)}",
        f"  last loss {_num(latest.get('loss'), '.4g')}, "
        f"best loss {_num(latest.get('best_loss'), '.4g')}, "
        f"{', '.join(throughput(latest))}, "
        f"{_num(latest.get('step_time', math.nan) * 1e3, '.1f')} ms/step",
    ]
    if "mfu" in frame.notes:
        lines.append(f"  {frame.notes['mfu']}")
    clip = clip_summary(latest)
    if clip:
        lines.append(f"  gradient norm {clip}")
    if frame.adapters:
        lines.append(f"  {frame.adapters}")
    if frame.alerts:
        lines.append(f"  {len(frame.alerts)} alert(s); latest: {frame.alerts[-1].message}")
    if frame.errors:
        lines.append(f"  {len(frame.errors)} error(s); latest: {frame.errors[-1]}")
    return "\n".join(lines)


class ConsoleView:
    """Logs ``status_line`` at most every ``every`` seconds, a fine-tune's adapter verdict
    (``Frame.adapters``) when it changes state, and ``summary_text`` at close."""

    # Only the latest numbers: the monitor skips chart series and the layer panel for it.
    wants_detail = False

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every = every
        self._clock = clock
        self._last = -math.inf
        self._closed = False
        self._adapters = ""  # the state ("adapters learning") of the verdict last logged

    def publish(self, frame: Frame) -> None:
        state = frame.adapters.split(":")[0]
        if not self._closed and state != self._adapters:
            self._adapters = state
            self._logger.info(frame.adapters)
        now = self._clock()
        if self._closed or now - self._last < self._every:
            return
        self._last = now
        self._logger.info(status_line(frame))

    def close(self, frame: Frame) -> None:
        if self._closed:
            return
        self._closed = True
        self._logger.info(summary_text(frame))
