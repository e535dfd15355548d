"""A rank's own requests go to its whole job (torchrun's environment, in this process): a
``mon.stop()`` on a rank is written to the job folder naming a step ahead (from the rank's
step rate and the sampler interval), read back by the rank's sampler like any rank's, and the
loop ends at exactly that step; a closed rank speaks for its job no more."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch
from tests.dist.test_rank_monitor import as_rank
from tests.helpers import mlp, wait_for

import nbmonitor
from nbmonitor.runs.job_control import MIN_AHEAD, write_job_request

pytestmark = pytest.mark.timeout(120)


def step_once(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_a_ranks_stop_is_the_jobs_at_a_step_named_ahead(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_rank(monkeypatch, 1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05, display=False)
    assert mon.job_dir is not None
    control = mon.job_dir / "control"
    try:
        for _ in range(30):
            step_once(model, opt)
        assert mon.flush()
        mon.stop()
        assert mon.steering.pending == 0  # not queued here: sent to the job
        [request] = [json.loads(p.read_text()) for p in control.iterdir()]
        at_step = request["at_step"]
        assert request["kind"] == "stop" and request["source"] == "rank1:python"
        assert at_step >= 30 + MIN_AHEAD
        # This rank's sampler reads it back, as every rank's does, and holds it for that step.
        assert wait_for(lambda: mon.steering.pending == 1)
        with pytest.raises(nbmonitor.StopTraining) as stopped:
            while mon.step < at_step + 10:
                step_once(model, opt)
        assert stopped.value.step == at_step == mon.step
    finally:
        mon.close()
    assert len(list(control.iterdir())) == 1  # kept for the other ranks
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["status"] == "stopped" and meta["last_step"] == at_step
    events = [json.loads(line) for line in (mon.run_dir / "events.jsonl").read_text().splitlines()]
    [stop] = [e for e in events if e.get("rule") == "steer"]
    assert (stop["step"], stop["evidence"]["source"]) == (at_step, "job/rank1:python")

    # Closed, the rank asks nothing of its job.
    mon.stop()
    assert len(list(control.iterdir())) == 1


def test_a_job_request_read_after_its_step_is_a_warning_not_an_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that reaches a rank after the step it names is taken at the rank's next step
    and said in its events as a warning; the run is not degraded for it (nothing failed)."""
    as_rank(monkeypatch, 1)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, interval=0.05, display=False)
    assert mon.job_dir is not None
    try:
        for _ in range(20):
            step_once(model, opt)
        assert mon.flush()
        write_job_request(mon.job_dir, "lr", 0.005, at_step=5, source="ctl")
        assert wait_for(lambda: mon.steering.pending == 1)
        step_once(model, opt)
        assert opt.param_groups[0]["lr"] == 0.005 and mon.steering.last_step == 21
        assert mon.flush()
        assert mon.status == "running" and mon.errors == []
    finally:
        mon.close()
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert meta["status"] == "closed"
    events = [json.loads(line) for line in (mon.run_dir / "events.jsonl").read_text().splitlines()]
    [late] = [e for e in events if e.get("rule") == "steer" and e["severity"] == "warning"]
    assert "named step 5 but reached rank 1 later" in late["message"]
    assert "the end of step 21" in late["message"]
