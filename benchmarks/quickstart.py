"""How long the quickstart notebook takes, run as a user runs it: every cell of
notebooks/01-quickstart.ipynb with its defaults, in a fresh Python kernel (nbclient), timed per
cell and in all, with the machine's load average before and after each run.

    python benchmarks/quickstart.py              # 3 runs, a table on stdout
    python benchmarks/quickstart.py --runs 5 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01-quickstart.ipynb"


def run_once() -> dict[str, Any]:
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    load_before = os.getloadavg()[0]
    cells: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nbm-quickstart-") as tmp:
        client = nbclient.NotebookClient(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp}}
        )
        t0 = time.perf_counter()
        with client.setup_kernel():
            kernel_ready = time.perf_counter() - t0
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                c0 = time.perf_counter()
                client.execute_cell(cell, index)
                cells.append(time.perf_counter() - c0)
        total = time.perf_counter() - t0
    printed = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    return {
        "total_s": round(total, 1),
        "kernel_start_s": round(kernel_ready, 1),
        "cells_s": [round(c, 1) for c in cells],
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        "output": printed.strip().splitlines()[0] if printed.strip() else "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    # The kernel imports the nbmonitor of this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    os.environ.pop("NBMONITOR_QUICKSTART_STEPS", None)
    runs = []
    for i in range(args.runs):
        if i:
            time.sleep(args.interval)
        runs.append(run_once())
        if not args.json:
            print(json.dumps(runs[-1]), flush=True)
    summary = {
        "cpus": os.cpu_count(),
        "median_total_s": statistics.median(r["total_s"] for r in runs),
        "median_training_cell_s": statistics.median(r["cells_s"][2] for r in runs),
        "runs": runs,
    }
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
    else:
        print(
            f"median total {summary['median_total_s']} s, training cell "
            f"{summary['median_training_cell_s']} s, {summary['cpus']} CPUs"
        )


if __name__ == "__main__":
    main()
