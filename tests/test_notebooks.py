"""Every notebook in notebooks/ runs top to bottom in a real kernel without errors (short runs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Set (CI's wheel stage): the kernels must import the installed nbmonitor, not this checkout.
INSTALLED = bool(os.environ.get("NBMONITOR_TEST_INSTALLED"))
WHERE = "import nbmonitor; print('nbmonitor from', nbmonitor.__file__)"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A copy, so runs/ lands in tmp_path and the kernel imports this checkout whether or not it
    # is installed (or, with NBMONITOR_TEST_INSTALLED, the installed package only).
    if path.name.startswith("04-"):
        pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
    if path.name.startswith("08-"):
        for tool in ("tensorboard", "pyarrow", "prometheus_client", "wandb"):
            pytest.importorskip(tool)
    work = tmp_path / path.name
    shutil.copy(path, work)
    monkeypatch.setenv("NBMONITOR_QUICKSTART_STEPS", "200")
    monkeypatch.setenv("NBMONITOR_FRAMEWORKS_STEPS", "20")
    if not INSTALLED:
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        )
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    nb = nbformat.read(work, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(WHERE))
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    where = nb.cells.pop()
    origin = Path("".join(o.get("text", "") for o in where.outputs).split("from", 1)[1].strip())
    assert origin.is_relative_to(ROOT) != INSTALLED, f"the kernel imported {origin}"
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    errors = [out for out in outputs if out.output_type == "error"]
    assert not errors, errors
    if path.name.startswith("01-"):
        # attach() displayed the dashboard: the widget view plus the static fallback.
        displays = [out for out in outputs if out.output_type == "display_data"]
        assert any(WIDGET_VIEW in out.data and "text/html" in out.data for out in displays)
        stderr = "".join(
            o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"
        )
        assert "Traceback" not in stderr
    if path.name.startswith("05-"):
        # The slow loader is named, the loader that has its data ready is not.
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "[input_bound] Input-bound:" in text
        assert "waits for data" in text and "num_workers" in text
        assert "data (span)" in text and "eval (span)" in text
        assert "of which waiting for data" in text and "\nFalse\n" in text
        # Token ids: tokens/s, FLOPs counted once, TFLOP/s; on a CPU MFU says why it is missing.
        assert "tokens/step 512, FLOPs/step" in text and "TFLOP/s" in text and "MFU" in text
        assert "profiles/steps-" in text and ".pt.trace.json" in text  # the profiler's trace
    if path.name.startswith("02-"):
        # Each section's bug is caught and named.
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        for expected in (
            "[gradient_not_flowing] Parameters that never received a gradient after",
            "image.weight, image.bias",
            "[params_not_in_optimizer]",
            "6.weight, 6.bias",
            "[grad_non_finite]",
            "stopped: nbmonitor: non-finite gradient",
            "[vanishing_gradients]",
            "[dead_units]",
            "first module with a non-finite output was layer 0 (Linear)",
            "outputs of layer 3 (ReLU) are exactly zero",
        ):
            assert expected in text, expected
        # nbmonitor prints nothing of its own into the cells (a numpy RuntimeWarning did).
        stderr = "".join(
            o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"
        )
        assert "Warning" not in stderr, stderr
    if path.name.startswith("08-"):
        # Live: the Prometheus endpoint served the run, nothing failed, the files were
        # written; from disk: CSV, TensorBoard, W&B offline and the command line.
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert 'nbmonitor_steps_total{host="' in text and "nbmonitor_step_time_seconds{" in text
        assert "\n[]\n" in text  # mon.errors
        assert "['layers', 'system', 'train']" in text
        assert "history.parquet" in text and "history.csv" in text
        assert "exported-tb" in text and "offline-run-" in text
        assert "-> parquet: exported-parquet" in text
    if path.name.startswith("04-"):
        # The Trainer's notebook progress table and the nbmonitor dashboard both showed, and
        # nbmonitor's steps are the Trainer's.
        displays = [out for out in outputs if out.output_type == "display_data"]
        assert any(
            WIDGET_VIEW in out.data and "nbmonitor" in out.data["text/html"] for out in displays
        )
        assert any(
            "<progress" in out.data.get("text/html", "")
            and "Training Loss" in out.data.get("text/html", "")
            for out in displays
        )
        text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
        assert "nbmonitor: 20 steps; Trainer: global_step 20" in text
