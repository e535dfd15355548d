"""Importing nbmonitor is cheap: no widget libraries, no thread, no NVML initialisation."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_starts_nothing() -> None:
    code = (
        "import sys, threading, json\n"
        "import nbmonitor\n"
        "nvml = sys.modules.get('pynvml')\n"
        "inited = False\n"
        "if nvml is not None:\n"
        "    try:\n"
        "        nvml.nvmlDeviceGetCount()\n"
        "        inited = True\n"
        "    except Exception:\n"
        "        inited = False\n"
        "print(json.dumps({'modules': [m for m in ('ipywidgets', 'anywidget', 'bqplot')\n"
        "                              if m in sys.modules],\n"
        "                  'threads': [t.name for t in threading.enumerate()],\n"
        "                  'nvml_initialised': inited}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {"modules": [], "threads": ["MainThread"], "nvml_initialised": False}
