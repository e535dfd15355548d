"""How often the quickstart raises an alert: every cell of notebooks/01-quickstart.ipynb with
its defaults, in a fresh Python kernel (nbclient), run after run, each followed by a cell that
prints the alerts the run raised. A healthy notebook must raise none, idle or on a busy machine
(issue 42: 20 runs of 20).

    python benchmarks/quickstart_alerts.py --runs 20
    bash scripts/cpu-load python benchmarks/quickstart_alerts.py --runs 20
    python benchmarks/quickstart_alerts.py --runs 3 --memory   # and the RSS floors per run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "01-quickstart.ipynb"
MARK = "NBMONITOR-ALERTS "
# Appended to the notebook: the run's alerts and what its process held, as one JSON line.
REPORT = f"""
import json as _json
_sys = mon.system()
_rss = [float(v) for v in _sys.get("process_rss_bytes", [])]
print({MARK!r} + _json.dumps({{
    "alerts": [[a.rule, a.step, a.message] for a in mon.events()],
    "rss_first_mib": round(_rss[0] / 2**20, 1) if _rss else None,
    "rss_last_mib": round(_rss[-1] / 2**20, 1) if _rss else None,
    "samples": len(_rss),
}}))
"""


def run_once() -> dict[str, Any]:
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="nbm-quickstart-") as tmp:
        client = nbclient.NotebookClient(
            nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp}}
        )
        t0 = time.perf_counter()
        client.execute()
        total = time.perf_counter() - t0
    printed = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
    line = next((x for x in printed.splitlines() if x.startswith(MARK)), None)
    report = json.loads(line[len(MARK) :]) if line else {"alerts": [["<no report>", 0, ""]]}
    return {
        "total_s": round(total, 1),
        "load_before": round(load_before, 1),
        "load_after": round(os.getloadavg()[0], 1),
        **report,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between runs")
    parser.add_argument("--json", help="write every run's record to this file")
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
        run = run_once()
        runs.append(run)
        rules = [a[0] for a in run["alerts"]]
        print(
            f"run {i + 1:2d}: {run['total_s']:6.1f} s, load {run['load_before']:.1f} -> "
            f"{run['load_after']:.1f}, RSS {run.get('rss_first_mib')} -> "
            f"{run.get('rss_last_mib')} MiB, alerts {rules or 'none'}",
            flush=True,
        )
        for rule, step, message in run["alerts"]:
            print(f"    {rule} at step {step}: {message}", flush=True)
    quiet = sum(not r["alerts"] for r in runs)
    counts = Counter(a[0] for r in runs for a in r["alerts"])
    print(f"{quiet} of {len(runs)} runs raised no alert; alerts: {dict(counts) or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0 if quiet == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
