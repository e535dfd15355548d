"""An out-of-memory error raised inside a notebook cell, in a real kernel: the card shows under
the cell, and ``mon.free_oom()`` gives back the memory the stored traceback held (RSS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

SETUP = """
import torch, nbmonitor
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters())
mon = nbmonitor.attach(model, opt, run_dir=RUN_DIR, interval=0.1, display=False)
for _ in range(3):
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
mon.flush()
"""
# The step that fails holds 256 MiB in a local: after the error only the traceback holds it.
FAIL = """
def train_step():
    features = torch.ones(64 * 2**20)  # 256 MiB of float32
    return torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator refuses this one

train_step()
"""
FREE = """
freed = mon.free_oom()
print(json.dumps({"freed": freed.freed_bytes, "what": freed.what, "released": freed.released}))
"""


def _texts(cell: dict) -> list[str]:
    out = []
    for output in cell["outputs"]:
        if output["output_type"] in ("display_data", "execute_result"):
            out.append(output["data"].get("text/plain", ""))
    return out


def test_an_oom_in_a_cell_shows_the_card_and_free_oom_gives_the_memory_back(
    tmp_path: Path,
) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"import json\nRUN_DIR = {str(tmp_path)!r}\n" + SETUP),
        nbformat.v4.new_code_cell(FAIL),
        nbformat.v4.new_code_cell(FREE),
        nbformat.v4.new_code_cell("print(1 + 1)\nmon.close()"),
    ]
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )  # fmt: skip
    client.execute()
    setup, fail, free, after = nb.cells
    assert not [o for o in setup["outputs"] if o["output_type"] == "error"]
    errors = [o for o in fail["outputs"] if o["output_type"] == "error"]
    assert errors and "DefaultCPUAllocator" in errors[0]["evalue"]
    cards = [t for t in _texts(fail) if "out of memory" in t]
    assert len(cards) == 1, fail["outputs"]
    card = cards[0]
    assert card.startswith("nbmonitor: CPU out of memory, allocating 4.29e+09 GiB at step 4.")
    assert "held: parameters" in card and "optimizer_state" in card
    assert "local `features` in train_step" in card  # the largest tensor, named by its frame
    assert "256 MiB" in card and "mon.free_oom()" in card
    html = [o["data"]["text/html"] for o in fail["outputs"] if "text/html" in o.get("data", {})]
    assert any("Largest live tensors" in h for h in html)
    printed = "".join(o.get("text", "") for o in free["outputs"] if o["output_type"] == "stream")
    result = json.loads(printed)
    assert result["what"] == "resident memory (RSS)"
    assert result["freed"] >= 200 * 2**20, result  # the 256 MiB the traceback held
    assert "sys.last_traceback" in result["released"]
    assert not [o for o in after["outputs"] if o["output_type"] == "error"]
