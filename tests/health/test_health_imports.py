"""``nbmonitor.health`` imports without torch, widgets or the training-thread package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbmonitor

ROOT = Path(nbmonitor.__file__).resolve().parent.parent


def test_health_imports_with_a_torch_that_raises(tmp_path: Path) -> None:
    stub = tmp_path / "torch"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('torch is stubbed out for this test')\n")
    code = (
        "import json, sys\n"
        "import nbmonitor.health as health\n"
        "from nbmonitor.health import Alert, Health, HealthInput, Thresholds\n"
        "import numpy as np\n"
        "steps = {'step': np.arange(1.0, 31.0), 'loss': np.r_[np.ones(29), np.inf]}\n"
        "alerts = Health().check(HealthInput(step=30, time=0.0, steps=steps))\n"
        "print(json.dumps({'alerts': [a.rule for a in alerts],\n"
        "                  'loaded': sorted(m for m in sys.modules if m.split('.')[0] in\n"
        "                      ('torch', 'ipywidgets', 'anywidget', 'bqplot')\n"
        "                      or m.startswith(('nbmonitor._capture', 'nbmonitor.ui')))}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {"alerts": ["loss_non_finite"], "loaded": []}
