"""Where each sampler tick's rows go: the Sink protocol, a null sink, a fan-out, and the run
log as its first member. Sampler thread; no torch, no widget libraries. See README.md."""

from __future__ import annotations

from nbmonitor.sinks.base import Batch, FanOut, NullSink, Sink
from nbmonitor.sinks.runlog import RunLogSink

__all__ = ["Batch", "FanOut", "NullSink", "RunLogSink", "Sink"]
