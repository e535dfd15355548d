"""The machine entrance: watch this machine's devices without a model (no torch).

``watch.py`` is ``nbmonitor.devices()`` and its ``DeviceWatch`` (the machine backend, a run's
sampler, device rules and run log, views of ``DevicesFrame``); ``top.py`` is the terminal's
composition root (``nbmonitor top``, ``nbmonitor tail RUN --tui``): a device watch and a
``runs.watch.RunsWatch`` feeding ``ui/tui``. Imports neither ``nbmonitor.live`` nor
``nbmonitor.replay``.
"""

from nbmonitor.machine.watch import DeviceWatch, devices

__all__ = ["DeviceWatch", "devices"]
