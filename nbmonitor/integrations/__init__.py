"""Thin adapters for training frameworks: each module imports its framework and calls
``nbmonitor.attach`` and the Monitor's public methods (``log``, ``batch_started``, ``close``)
(see docs/guide.md, "Use with ...")."""
