"""``display=False`` prints nothing: no status line and no closing line, even where logging is
set up to print INFO records (the run log on disk is still written)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_display_false_prints_nothing_even_with_logging_set_up(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import logging, torch, nbmonitor
        logging.basicConfig(level=logging.INFO)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with nbmonitor.attach(model, opt, run_dir={str(tmp_path)!r}, display=False,
                              interval=0.05) as mon:
            for _ in range(20):
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            mon.flush()
        print("steps", len(nbmonitor.open(mon.run_dir).history()["step"]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "steps 20"
    assert "nbmonitor" not in out.stderr, out.stderr
    # The same script with display=True does print (the test can fail).
    shown = subprocess.run(
        [sys.executable, "-c", script.replace("display=False", "display=True")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "nbmonitor" in shown.stderr
