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


# The torch-free side of the package: reading runs, rules, views and the engine (DESIGN.md 2).
TORCH_FREE = (
    "nbmonitor",
    "nbmonitor.errors",
    "nbmonitor.records",
    "nbmonitor.replay",
    "nbmonitor.replay.job",
    "nbmonitor.health",
    "nbmonitor.ui",
    "nbmonitor.ui.dashboard",
    "nbmonitor.ui.console",
    "nbmonitor._engine.frame",
    "nbmonitor._engine.pipeline",
    "nbmonitor.backends",
)


def test_torch_free_modules_import_with_a_torch_that_raises(tmp_path) -> None:
    stub = tmp_path / "torch"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    code = (
        "import importlib, sys\n"
        f"for name in {TORCH_FREE!r}:\n"
        "    importlib.import_module(name)\n"
        "import nbmonitor\n"
        "assert nbmonitor.__version__\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "print('ok')\n"
    )
    env_path = f"{tmp_path}"
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {env_path!r})\n" + code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_a_torch_name_says_torch_is_needed_when_it_is_missing(tmp_path) -> None:
    stub = tmp_path / "torch"
    stub.mkdir()
    (stub / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import nbmonitor\n"
        "try:\n"
        "    nbmonitor.attach\n"
        "except ImportError as exc:\n"
        "    print('ImportError', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ImportError" in out.stdout and "torch" in out.stdout
