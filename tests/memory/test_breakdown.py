"""The memory breakdown against hand-computed sizes: parameters, gradients, optimizer state by
dtype and module, shared storages counted once, saved activations of a known model."""

from __future__ import annotations

import json

import pytest
import torch

import nbmonitor
from nbmonitor._capture.memory_breakdown import held
from nbmonitor.memory import MemoryBreakdown


def model3() -> torch.nn.Sequential:
    # Linear(10, 20) and Linear(20, 5): 220 + 105 parameters.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5))


N0, N2 = 10 * 20 + 20, 20 * 5 + 5


def one_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int = 8) -> None:
    dtype = next(model.parameters()).dtype
    loss = model(torch.randn(batch, 10, dtype=dtype)).float().pow(2).mean()
    loss.backward()
    opt.step()


def breakdown(model: torch.nn.Module, opt: torch.optim.Optimizer | None) -> MemoryBreakdown:
    rows, _ = held(model, opt)
    return MemoryBreakdown(tuple(rows))


# Optimizer state per parameter element, and per-parameter extra bytes (Adam's float32
# "step" counter, one element per parameter tensor).
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), 0, 0),
    "sgd_momentum": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1, 0),
    "adam": (lambda p: torch.optim.Adam(p), 2, 4),
    "adamw": (lambda p: torch.optim.AdamW(p), 2, 4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_breakdown_matches_hand_computed_sizes(kind: str, dtype: torch.dtype) -> None:
    make, per_element, step_bytes = OPTIMIZERS[kind]
    model = model3().to(dtype)
    opt = make(model.parameters())
    one_step(model, opt)
    size = torch.tensor([], dtype=dtype).element_size()
    got = breakdown(model, opt)
    assert got.by_category() == {
        "parameters": (N0 + N2) * size,
        "buffers": 0,
        "gradients": (N0 + N2) * size,
        "optimizer_state": (N0 + N2) * size * per_element + 4 * step_bytes,
        "activations": 0,
    }
    modules = got.by_module()
    assert list(modules) == ["0", "2"]
    assert modules["0"]["parameters"] == N0 * size
    assert modules["2"]["optimizer_state"] == N2 * size * per_element + 2 * step_bytes
    name = str(dtype).removeprefix("torch.")
    assert got.by_dtype()[name]["parameters"] == (N0 + N2) * size
    if step_bytes:  # Adam's step counters are float32 whatever the parameters are
        assert got.by_dtype()["float32"]["optimizer_state"] >= 4 * step_bytes


def test_shared_storage_counts_once() -> None:
    emb = torch.nn.Embedding(50, 8)
    head = torch.nn.Linear(8, 50, bias=False)
    head.weight = emb.weight  # tied, as language models tie input and output embeddings
    model = torch.nn.Sequential(emb, head)
    got = breakdown(model, None)
    assert got.bytes("parameters") == 50 * 8 * 4
    view = torch.nn.Module()
    base = torch.zeros(100)
    view.register_buffer("a", base[:50])
    view.register_buffer("b", base[50:])
    # Two views of one storage: the storage once, all of it.
    assert breakdown(view, None).bytes("buffers") == 100 * 4


def test_buffers_and_an_optimizer_parameter_outside_the_model() -> None:
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(6))
    extra = torch.nn.Parameter(torch.zeros(7))
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    got = breakdown(model, opt)
    # running_mean, running_var (6 floats each) and num_batches_tracked (one int64).
    assert got.bytes("buffers") == 6 * 4 * 2 + 8
    assert got.by_module()["(other)"]["parameters"] == 7 * 4
    assert got.bytes("parameters") == 12 * 4 + 7 * 4


def test_saved_activations_of_a_known_model(tmp_path) -> None:
    model = model3()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = 8
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        one_step(model, opt, batch)
        got = mon.memory()
    # Linear 0 saves its input (its weight is a parameter, not an activation); the ReLU saves
    # its output, which Linear 2 saves again as its input: one storage, counted under the ReLU.
    assert got.activations_step == 1
    modules = got.by_module()
    assert modules["0"]["activations"] == batch * 10 * 4
    assert modules["1"]["activations"] == batch * 20 * 4
    assert modules["2"]["activations"] == 0
    assert got.bytes("activations") == batch * 30 * 4
    # The hooks are gone after the forward: nothing stays pushed for the user's code.
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_a_forward_that_raises_leaves_no_saved_tensor_hooks(tmp_path) -> None:
    class Boom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60):
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.randn(2, 4))
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_the_run_folder_keeps_the_breakdown(tmp_path) -> None:
    model = model3()
    opt = torch.optim.Adam(model.parameters())
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        for _ in range(3):
            one_step(model, opt)
            opt.zero_grad()
    run = nbmonitor.open(mon.run_dir)
    got = run.memory()  # the newest: sampled on the first two steps, then every layer_every
    assert got is not None and got.step == 2
    assert got.by_category()["optimizer_state"] == (N0 + N2) * 4 * 2 + 4 * 4
    assert got.bytes("activations") == 8 * 30 * 4
    first = run.memory(step=1)
    assert first is not None and first.step == 1
    assert run.memory(step=0) is None
    lines = (mon.run_dir / "memory.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert "optimizer_state" in str(got) and "<table>" in got._repr_html_()


def test_mon_memory_is_one_object_called_for_the_breakdown(tmp_path) -> None:
    """``mon.memory`` is one object: called it reads the breakdown now, as ``breakdown()``
    does; once the model is gone it is the newest breakdown the run published."""
    import gc

    model = model3()
    opt = torch.optim.Adam(model.parameters())
    mon = nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60)
    try:
        one_step(model, opt)
        assert mon.memory is mon.memory
        called, named = mon.memory(), mon.memory.breakdown()
        assert called.rows == named.rows and called.step == named.step == 1
        assert called.by_category()["optimizer_state"] == (N0 + N2) * 4 * 2 + 4 * 4
        assert mon.memory.recording is False  # memory_history off
        with pytest.raises(RuntimeError, match="needs attach"):
            mon.memory.snapshot(tmp_path / "x.pickle")
        assert mon.flush()
        memory = mon.memory
        del model, opt
        gc.collect()
        published = memory()  # the model collected: its run's newest published breakdown
        assert published.by_category() == called.by_category()
    finally:
        mon.close()


def test_a_bad_memory_record_is_a_one_line_error(tmp_path) -> None:
    model = model3()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60) as mon:
        one_step(model, opt)
    path = mon.run_dir / "memory.jsonl"
    bad = {
        "step": 2,
        "rows": [
            {
                "category": "parameters",
                "module": "x",
                "dtype": "f",
                "device": "cpu",
                "bytes": -1,
                "tensors": 1,
            }
        ],
    }
    path.write_text(path.read_text() + json.dumps(bad) + "\n")
    with pytest.raises(nbmonitor.RunDirError, match="bytes is not a count"):
        nbmonitor.open(mon.run_dir).memory()
    with pytest.raises(ValueError, match="unknown memory category"):
        MemoryBreakdown.from_record({"rows": [{**bad["rows"][0], "bytes": 1, "category": "x"}]})
    with pytest.raises(ValueError, match="no list of rows"):
        MemoryBreakdown.from_record({"rows": "x"})


def test_to_pandas() -> None:
    pd = pytest.importorskip("pandas")
    got = breakdown(model3(), None).to_pandas()
    assert isinstance(got, pd.DataFrame)
    assert got["bytes"].sum() == (N0 + N2) * 4


def test_live_and_replayed_frames_say_the_same_headroom(tmp_path) -> None:
    model = model3()
    opt = torch.optim.Adam(model.parameters())
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=0.05) as mon:
        for _ in range(5):
            one_step(model, opt)
            opt.zero_grad()
        mon.flush()
        live_frame = mon.frame()
        live = live_frame.latest
    replayed_frame = nbmonitor.open(mon.run_dir).frame()
    replayed = replayed_frame.latest
    assert live["batch_size"] == replayed["batch_size"] == 8
    assert live["memory_limit_bytes"] > 0 and "batch_fits" in live and "batch_fits" in replayed
    # The estimate's fixed part is the breakdown's: the same breakdown live and replayed.
    assert nbmonitor.open(mon.run_dir).memory() is not None
    # The Memory tab's table: the same categories live and replayed, on the CPU, measured.
    assert live_frame.memory is not None and replayed_frame.memory is not None
    counted = ("parameters", "buffers", "gradients", "optimizer_state", "activations")
    for frame in (live_frame, replayed_frame):
        (row,) = frame.memory.rows  # type: ignore[union-attr]
        assert row["device"] == "cpu" and row["measured_what"] == "resident size"
        assert row["parameters"] == (N0 + N2) * 4 and row["activations"] > 0
    assert [r[c] for r in live_frame.memory.rows for c in counted] == [
        r[c] for r in replayed_frame.memory.rows for c in counted
    ]
