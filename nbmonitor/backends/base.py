"""The one contract every device backend fulfils."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Backend(Protocol):
    """A source of device and system statistics, sampled by the sampler thread.

    ``sample()`` returns the same keys every call (``keys``), with NaN for anything that cannot
    be read right now. It must not raise for an unavailable field; it may raise for a real
    failure, which the sampler counts and reports.
    """

    name: str
    devices: tuple[str, ...]

    @property
    def keys(self) -> tuple[str, ...]: ...

    def sample(self) -> dict[str, float]: ...

    def close(self) -> None: ...
