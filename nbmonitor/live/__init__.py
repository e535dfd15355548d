"""The live entrance: ``attach()`` and the ``Monitor`` of a run in this process (torch).

``monitor.py`` is the Monitor, whole (its read API included); ``build.py`` constructs the
sampler side complete; ``lifetime.py`` owns what closes; ``registry.py`` knows the live
monitors; ``ranks.py`` is one rank of a distributed job; ``profile.py`` is ``mon.profile()``;
``setup_check.py`` the checks at attach; ``parts.py`` and ``redact.py`` the run's meta.json.
Imported only by ``nbmonitor/__init__`` and ``integrations/``; never imports
``nbmonitor.replay`` (lint).
"""

from nbmonitor.live.monitor import Monitor, attach
from nbmonitor.live.profile import Profile

__all__ = ["Monitor", "Profile", "attach"]
