"""One rank's run folder made as attach() makes it, without torch (fast to launch many
times): the script tests/dist/test_rank_dirs_race.py starts once per rank. Arguments:
run_dir, a wall-clock time to wait for (so the ranks collide). Prints the folder."""

from __future__ import annotations

import sys
import time

from nbmonitor._capture.dist import rank_info
from nbmonitor.sinks.runlog import RunLogSink


def main() -> None:
    run_dir, start_at = sys.argv[1], float(sys.argv[2])
    info = rank_info()
    assert info is not None, "RANK and WORLD_SIZE must be set"
    assert "torch" not in sys.modules
    time.sleep(max(0.0, start_at - time.time()))
    log = RunLogSink.create(run_dir, "Net", {**info.as_meta()}, job_id=info.job_id,
                            rank=info.rank, world_size=info.world_size)  # fmt: skip
    log.close({"status": "closed"})
    print(log.path, flush=True)


if __name__ == "__main__":
    main()
