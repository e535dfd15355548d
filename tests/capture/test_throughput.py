"""Tokens per step from token-id inputs, and the FLOPs counted once (``probes/flops.py``):
what the sampler turns into tokens/s, TFLOP/s and MFU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.tiny_lm import TinyLM, lm_step
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count

import nbmonitor
from nbmonitor._capture.inputs import batch_tokens, token_count
from nbmonitor._capture.probes.flops import EXTRA_FORMULAS, compute_dtype
from nbmonitor._engine.derive.mfu import transformer_flops_per_token


def _sdpa_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs):  # type: ignore[no-untyped-def]
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)  # type: ignore[no-untyped-call]


def full_step_flops(model: TinyLM, batch: int, seq: int) -> int:
    """FlopCounterMode over a whole training step (forward, backward, optimizer step), with
    the CPU attention kernels counted too (torch's counter has no formula for them)."""
    mapping = dict(EXTRA_FORMULAS)
    backward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if backward is not None:
        mapping[backward] = _sdpa_backward
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        lm_step(model, opt, batch=batch, seq=seq)
    return int(counter.get_total_flops())


def test_token_count_reads_input_ids_and_2d_integer_inputs() -> None:
    ids = torch.randint(0, 10, (4, 16))
    assert token_count((), {"input_ids": ids}) == 64
    assert token_count((ids,), {}) == 64
    assert token_count((ids.int(),), {"attention_mask": torch.ones(4, 16)}) == 64
    assert token_count((torch.randn(4, 16),), {}) == 0  # features, not token ids
    assert token_count((torch.randint(0, 9, (2, 3, 4)),), {}) == 0  # images of ints
    assert token_count((), {"input_ids": torch.randn(4, 16)}) == 0
    assert token_count((), {"x": ids}) == 0


def test_batch_tokens_reads_a_framework_batch() -> None:
    ids = torch.randint(0, 10, (2, 8))
    assert batch_tokens({"input_ids": ids, "labels": ids}) == 16
    assert batch_tokens((ids, torch.randn(2))) == 16
    assert batch_tokens(ids) == 16
    assert batch_tokens((torch.randn(2, 8), ids)) == 0
    assert batch_tokens([]) == 0 and batch_tokens(None) == 0


def test_tokens_per_s_from_a_token_id_model(tmp_path: Path) -> None:
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters())
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(4):
            lm_step(model, opt, batch=4, seq=16)
        mon.flush()
        h = mon.history()
    assert h["tokens"].tolist() == [64.0] * 4
    np.testing.assert_allclose(h["tokens_per_s"], 64 / h["step_time"])
    assert h["samples"].tolist() == [4.0] * 4


def test_a_model_without_token_ids_has_no_tokens_column(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(3):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        h = mon.history()
    assert "tokens_per_s" not in h
    # 2 x in x out multiply-adds per sample in the forward, 3 forwards' worth per step.
    assert h["flops_per_step"].tolist() == [3 * 2 * 8 * 4] * 3


def test_flops_per_step_match_flop_counter_over_a_full_step(tmp_path: Path) -> None:
    model = TinyLM()
    expected = full_step_flops(model, batch=4, seq=16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(3):
            lm_step(model, opt, batch=4, seq=16)
        mon.flush()
        h = mon.history()
    counted = h["flops_per_step"]
    assert np.all(counted == counted[0])
    # The backward of the attention kernel costs 2.5 forwards in torch's count, not 2.
    assert counted[0] == pytest.approx(expected, rel=0.05)
    np.testing.assert_allclose(h["tflops_per_s"], counted / h["step_time"] / 1e12)


def test_flops_follow_the_tokens_of_each_step(tmp_path: Path) -> None:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        lm_step(model, opt, batch=4, seq=16)
        # Two micro-batches in one step: twice the tokens, twice the FLOPs.
        for _ in range(2):
            ids = torch.randint(0, 64, (4, 16))
            logits = model(input_ids=ids)
            F.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
        mon.flush()
        h = mon.history()
    assert h["tokens"].tolist() == [64.0, 128.0]
    assert h["flops_per_step"][1] == 2 * h["flops_per_step"][0]


def test_the_formula_agrees_with_the_counter() -> None:
    model = TinyLM(vocab=64, width=32, layers=2, heads=2)
    batch, seq = 4, 16
    weights = sum(p.numel() for p in model.parameters() if p.dim() > 1)
    formula = transformer_flops_per_token(
        weights, n_layers=2, hidden=32, seq_len=seq, embedding_params=model.embed.weight.numel()
    )
    assert formula * batch * seq == pytest.approx(full_step_flops(model, batch, seq), rel=0.05)


def test_flops_false_counts_nothing(tmp_path: Path) -> None:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, flops=False) as mon:
        lm_step(model, opt)
        mon.flush()
        h = mon.history()
    assert "tokens_per_s" in h and "tflops_per_s" not in h


def test_only_the_first_forward_is_counted_and_no_mode_is_left(tmp_path: Path) -> None:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen: list[int] = []
    hook = model.register_forward_hook(lambda *_: seen.append(torch._C._len_torch_dispatch_stack()))
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False):
        for _ in range(3):
            lm_step(model, opt)
    hook.remove()
    # The model's own hook runs before nbmonitor's (registered later) leaves the count.
    assert seen == [1, 0, 0]
    assert torch._C._len_torch_dispatch_stack() == 0


def test_a_forward_that_raises_leaves_no_counting_mode(tmp_path: Path) -> None:
    class Flaky(TinyLM):
        fail = True

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            out = super().forward(input_ids)
            if self.fail:
                self.fail = False
                raise RuntimeError("out of memory, say")
            return out

    model = Flaky()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        with pytest.raises(RuntimeError, match="out of memory"):
            lm_step(model, opt)
        lm_step(model, opt)  # the next forward drops the count left open, and counts afresh
        assert torch._C._len_torch_dispatch_stack() == 0
        mon.flush()
        h = mon.history()
    assert torch._C._len_torch_dispatch_stack() == 0
    assert h["flops_per_step"][0] > 0


def test_a_cpu_run_shows_tflops_and_says_why_mfu_is_missing(tmp_path: Path) -> None:
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(2):
            lm_step(model, opt)
        mon.flush()
        h = mon.history()
        frame = mon.frame(detail=False)
        assert mon.events() == []  # a note on the figure, not an alert on every CPU run
    assert np.all(np.isfinite(h["tflops_per_s"])) and np.all(h["tflops_per_s"] > 0)
    assert np.all(np.isnan(h["mfu_percent"]))
    assert frame.latest["tflops_per_s"] > 0 and np.isnan(frame.latest["mfu_percent"])
    assert frame.notes["mfu"].startswith("MFU is not shown: nbmonitor has no peak FLOP/s for CPU")


def test_compute_dtype_follows_autocast_and_parameters() -> None:
    model = torch.nn.Linear(4, 4)
    assert compute_dtype(model) == "float32"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert compute_dtype(model) == "bfloat16"
    assert compute_dtype(model.half()) == "float16"
    assert compute_dtype(torch.nn.ReLU()) == "float32"  # no parameters


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_a_compiled_model_is_counted_like_the_eager_one(tmp_path: Path) -> None:
    model = TinyLM()
    eager = full_step_flops(TinyLM(), batch=4, seq=16)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False) as mon:
        for _ in range(2):
            ids = torch.randint(0, 64, (4, 16))
            logits = compiled(input_ids=ids)
            F.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        h = mon.history()
        assert mon.errors == []
    assert h["flops_per_step"][0] == pytest.approx(eager, rel=0.05)
    assert torch._C._len_torch_dispatch_stack() == 0


def test_a_first_forward_that_raises_leaves_no_flop_counter_after_close(tmp_path) -> None:
    """The FLOPs count opens as the first forward starts; a forward that raises never ends it.
    Closing the monitor must leave it, or torch's global module hooks and the counter's dispatch
    mode stay for the rest of the process (torch.compile then warns about global hooks)."""
    import torch.nn.modules.module as module_hooks
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    class Boom(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Boom())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = (len(module_hooks._global_forward_hooks), len(module_hooks._global_forward_pre_hooks))
    with nbmonitor.attach(model, opt, run_dir=tmp_path, display=False, interval=60):
        with pytest.raises(RuntimeError, match="boom"):
            model(torch.randn(2, 4))
        assert len(_get_current_dispatch_mode_stack()) == 1  # the count is still open here
    after = (len(module_hooks._global_forward_hooks), len(module_hooks._global_forward_pre_hooks))
    assert after == before
    assert _get_current_dispatch_mode_stack() == []
