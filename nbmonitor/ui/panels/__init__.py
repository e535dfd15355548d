"""The dashboard's panels, one module each; the JS module of the same name draws each one.

A new panel is one module here and one line in ``PANELS`` (and its ``js/src/panels/`` module
and one line in ``js/src/panels/index.js``): the widget carries a ``panel_<name>`` trait for
every name in ``NAMES``.
"""

from __future__ import annotations

from nbmonitor.ui.panels.base import Panel
from nbmonitor.ui.panels.devices import DevicesPanel
from nbmonitor.ui.panels.layers import LayersPanel
from nbmonitor.ui.panels.memory import MemoryPanel
from nbmonitor.ui.panels.ranks import RanksPanel
from nbmonitor.ui.panels.system import SystemPanel
from nbmonitor.ui.panels.timeline import TimelinePanel
from nbmonitor.ui.panels.training import TrainingPanel

# The tabs of a run's dashboard, in order, each fed the run's Frames.
PANELS: tuple[type[Panel], ...] = (
    TrainingPanel,
    SystemPanel,
    MemoryPanel,
    LayersPanel,
    TimelinePanel,
)
# The panels of other views: the ranks panel is fed a job's RanksFrames, the devices panel the
# DevicesFrames of nbmonitor.devices().
OTHER_PANELS: tuple[type[Panel], ...] = (RanksPanel, DevicesPanel)
NAMES = tuple(p.name for p in (*PANELS, *OTHER_PANELS))

__all__ = ["NAMES", "OTHER_PANELS", "PANELS", "Panel"]
