"""The disk entrance: runs and jobs on disk, opened, compared or followed; no torch.

``open``/``tail`` decide once whether a path is a run or a job of several ranks
(``entrance.py``); ``run.py`` is a run, ``job.py`` a job, ``follow.py`` the one follower of
either while another process writes it. Never imports ``nbmonitor.live`` (lint).
"""

from nbmonitor.replay.entrance import follow_in_terminal, open, tail
from nbmonitor.replay.follow import Follow
from nbmonitor.replay.job import Job
from nbmonitor.replay.run import Run, compare, compare_series
from nbmonitor.runs import list_runs

__all__ = [
    "Follow",
    "Job",
    "Run",
    "compare",
    "compare_series",
    "follow_in_terminal",
    "list_runs",
    "open",
    "tail",
]
