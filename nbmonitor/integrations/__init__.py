"""Thin adapters for training frameworks: each module imports its framework and calls
``nbmonitor.attach`` and ``Monitor.log`` as a user would (see README "Use with ...")."""
