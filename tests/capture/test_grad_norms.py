"""Per-tensor gradient norms: the CPU plan reads each gradient the cheapest way, and whatever the
way, the unpacked squares are the gradients' squared norms in parameter order."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from nbmonitor._capture.device_value import DeviceValue, HostRing
from nbmonitor._capture.probes.grad_norms import DOT_MIN_NUMEL, NormPass, cpu_plan
from nbmonitor._engine.assemble.steps import StepAssembler
from nbmonitor.records import NormLayout, StepRecord, squared_norms, squared_norms_split


def param(*shape: int, dtype: torch.dtype = torch.float32) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(*shape, dtype=torch.float64).to(dtype))


def mixed_params() -> list[torch.nn.Parameter]:
    return [
        param(256, 256),  # 0: large float32 -> dot
        param(256),  # 1: bias -> concat
        param(10, 256),  # 2: small 2-D -> dot, as the dot path runs anyway
        param(10),  # 3: bias -> concat
        param(DOT_MIN_NUMEL + 1),  # 4: large 1-D -> dot
        param(200, 100, dtype=torch.float64),  # 5: large float64 -> dot
        param(200, 100, dtype=torch.bfloat16),  # 6: large bfloat16 -> foreach
        param(0),  # 7: empty 1-D -> foreach
        param(5, dtype=torch.float64),  # 8: small float64 1-D -> dot
        param(7),  # 9: concat
        param(1),  # 10: concat
    ]


def give_grads(params: list[torch.nn.Parameter]) -> None:
    for p in params:
        p.grad = torch.randn(p.shape, dtype=torch.float64).to(p.dtype)


def expected_squares(params: list[torch.nn.Parameter], index: tuple[int, ...]) -> np.ndarray:
    return np.array([float(params[i].grad.double().pow(2).sum()) for i in index])


def unpacked(npass: NormPass) -> tuple[np.ndarray, tuple[int, ...]]:
    taken, index, layout = npass.take()
    # On the CPU the values are written into the next row of the pass's HostRing.
    value = taken.value() if isinstance(taken, HostRing) else taken
    assert value is not None and not isinstance(value, tuple)
    owners = index if index is not None else tuple(range(len(npass.params)))
    return squared_norms(value.array(), layout), owners


def test_cpu_plan_sorts_parameters_by_how_they_are_read() -> None:
    plan = cpu_plan(mixed_params())
    assert plan is not None
    assert plan.dots == (0, 2, 4, 5, 8)
    assert plan.concat == (1, 3, 9, 10)
    assert plan.rest == (6, 7)
    assert plan.order == (0, 2, 4, 5, 8, 6, 7, 1, 3, 9, 10)
    assert plan.layout == NormLayout(squared=5, norms=2, starts=(0, 256, 266, 273))


def test_cpu_plan_leaves_a_few_small_tensors_to_foreach_and_skips_what_gains_nothing() -> None:
    plan = cpu_plan([param(256, 256), param(256), param(3, 3), param(4), param(5)])
    assert plan is not None and plan.concat == () and plan.dots == (0, 1, 2, 3, 4)
    # one _foreach_norm is already one call
    assert cpu_plan([param(3, 3), param(4), param(5), param(6)]) is None
    assert cpu_plan([]) is None


def test_plan_path_gives_every_squared_norm_in_parameter_order() -> None:
    params = mixed_params()
    give_grads(params)
    npass = NormPass(params)
    assert npass.plan is not None
    squares, owners = unpacked(npass)
    assert owners == npass.plan.order
    # float32 dot products and bfloat16 gradients: compare with float32-level tolerance
    np.testing.assert_allclose(squares, expected_squares(params, owners), rtol=2e-5)


def test_non_contiguous_gradients_are_read_right() -> None:
    params = [param(256, 256), param(256), param(4), param(3), param(2)]
    give_grads(params)
    params[0].grad = torch.randn(256, 256).t()  # a transposed (non-contiguous) gradient
    params[1].grad = torch.randn(512)[::2]  # a strided 1-D gradient
    npass = NormPass(params)
    squares, owners = unpacked(npass)
    np.testing.assert_allclose(squares, expected_squares(params, owners), rtol=2e-5)
    # Flat views failed once: reshape from then on, without trying view() every step.
    assert npass._flat is torch.Tensor.reshape
    assert npass.take()[2] is not None  # still the planned path, not the general one


def test_missing_gradients_take_the_general_path_with_an_index() -> None:
    params = mixed_params()
    give_grads(params)
    params[1].grad = None
    params[5].grad = None
    value, index, layout = NormPass(params).take()
    assert value is not None and layout is None
    assert index == (0, 2, 3, 4, 6, 7, 8, 9, 10)
    squares = squared_norms(value.array(), layout)
    np.testing.assert_allclose(squares, expected_squares(params, index), rtol=2e-5)


def test_no_gradients_gives_nothing() -> None:
    assert NormPass(mixed_params()).take() == (None, None, None)


def test_a_sparse_gradient_falls_back_to_the_general_path() -> None:
    emb = torch.nn.Embedding(100, 200, sparse=True)  # 20,000 values: planned as a dot product
    biases = [param(8) for _ in range(4)]
    params = [emb.weight, *biases]
    emb(torch.tensor([1, 2, 2])).sum().backward()
    for k, b in enumerate(biases):
        b.grad = torch.full((8,), float(k))
    npass = NormPass(params)
    assert npass.plan is not None and npass.plan.dots == (0,) and npass.plan.concat
    squares, owners = unpacked(npass)
    assert owners == (0, 1, 2, 3, 4)
    dense = emb.weight.grad.to_dense()
    expected = [float(dense.pow(2).sum()), 0.0, 8.0, 32.0, 72.0]
    np.testing.assert_allclose(squares, expected, rtol=1e-5)


def test_a_nan_in_one_concatenated_tensor_stays_in_its_own_entry() -> None:
    layout = NormLayout(squared=1, norms=1, starts=(0, 2, 5))
    values = np.array([4.0, 3.0, 1.0, 1.0, math.nan, 0.0, 0.0, 2.0])
    squares = squared_norms(values, layout)
    assert squares[:3].tolist() == [4.0, 9.0, 2.0]
    assert math.isnan(squares[3])
    assert squares[4] == 4.0
    assert squared_norms(np.array([3.0, 4.0]), None).tolist() == [9.0, 16.0]


def test_dot_products_are_read_at_once_and_the_rest_on_the_sampler() -> None:
    # A dot product's float costs the training thread less than stacking its 0-d tensor; the
    # biases' copy is kept as it is (nbmonitor made it, nothing can change it) and read later.
    params = [param(256, 256), param(256), param(4), param(3), param(2)]
    give_grads(params)
    npass = NormPass(params)
    npass.host = None  # packed as a step recorded on its own is (no HostRing row)
    value, _, layout = npass.take()
    assert isinstance(value, DeviceValue) and layout is not None
    assert value._head is not None and len(value._head) == layout.squared == 1
    assert value._array is None and value._owned is not None and value._owned.dim() == 1


def test_norms_hold_no_autograd_graph() -> None:
    # Gradients that require grad themselves (double backward): the norms must not keep their
    # graph alive until the sampler reads them, nor make torch warn about reading them.
    model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(4)))
    params = list(model.parameters())
    loss = model(torch.randn(3, 256)).pow(2).sum()
    for p, g in zip(params, torch.autograd.grad(loss, params, create_graph=True), strict=True):
        p.grad = g
    assert params[0].grad is not None and params[0].grad.requires_grad
    npass = NormPass(params)
    assert npass.plan is not None and npass.plan.concat  # four biases: the cat path too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, _, _ = npass.take()  # (not into a HostRow row: out= refuses a graph)
    assert isinstance(value, DeviceValue) and value._owned is not None
    assert not value._owned.requires_grad


def test_float64_parameters_on_every_path() -> None:
    # torch refuses a float32 norm of a float64 tensor: the general path must not ask for one.
    params = [param(4, 4, dtype=torch.float64), param(3, dtype=torch.float64)]
    give_grads(params)
    npass = NormPass(params)
    assert npass.plan is None
    squares, owners = unpacked(npass)
    np.testing.assert_allclose(squares, expected_squares(params, owners), rtol=1e-12)


def test_a_tick_of_steps_packed_differently_unpacks_step_by_step() -> None:
    # Steps packed alike are unpacked together; a step with a missing gradient (general path,
    # with an index) or a NaN in between must not shift anyone's values.
    layout = NormLayout(squared=1, norms=0, starts=(0, 2))

    def record(step: int, values: list[float], **kw: object) -> StepRecord:
        # Packed as NormPass packs: the planned path's squared norms read already, the rest
        # in one tensor; the general path's norms in one tensor.
        if kw.get("norms_layout") is None:
            value = DeviceValue(torch.tensor(values, dtype=torch.float64))
        else:
            tail = torch.tensor(values[layout.squared :], dtype=torch.float32)
            value = DeviceValue.packed(values[: layout.squared], tail)
        return StepRecord(step, 0.0, 0.1, 0, 1, (), value, **kw)

    plan_index = (0, 1, 2)
    records = [
        record(1, [9.0, 1.0, 1.0, 2.0], norm_index=plan_index, norms_layout=layout),
        record(2, [16.0, 0.0, 3.0, 0.0], norm_index=plan_index, norms_layout=layout),
        record(3, [3.0, 4.0], norm_index=(0, 2)),  # norms of parameters 0 and 2 only
        record(4, [math.nan, 1.0, 1.0, 1.0], norm_index=plan_index, norms_layout=layout),
        record(5, [1.0, 0.0, 0.0, 0.0], norm_index=plan_index, norms_layout=layout),
    ]
    assembler = StepAssembler()
    assembler.add(records)
    rows = {int(r["step"]): r for r in assembler.take_final(everything=True)}
    assert rows[1]["grad_norm"] == pytest.approx(math.sqrt(9 + 2 + 4))
    assert rows[2]["grad_norm"] == pytest.approx(5.0)
    assert rows[3]["grad_norm"] == pytest.approx(5.0)
    assert math.isnan(rows[4]["grad_norm"])
    assert rows[5]["grad_norm"] == pytest.approx(1.0)
    # One block per run of steps packed alike, one row per step.
    blocks = assembler.layer_norms
    assert [b.steps for b in blocks] == [(1, 2), (3,), (4, 5)]
    assert [b.finite.tolist() for b in blocks] == [[True, True], [True], [False, True]]
    assert [b.index for b in blocks] == [plan_index, (0, 2), plan_index]
    np.testing.assert_allclose(blocks[0].norms, [[3.0, math.sqrt(2.0), 2.0], [4.0, 3.0, 0.0]])
    np.testing.assert_allclose(blocks[1].norms, [[3.0, 4.0]])
    np.testing.assert_allclose(blocks[2].norms[1], [1.0, 0.0, 0.0])


def test_a_tick_unpacks_its_parts_as_each_step_alone() -> None:
    # The sampler unpacks a tick's steps from their parts without joining them first; the
    # result must be what each step's own values give (dots, foreach norms, raw values).
    params = mixed_params()
    npass = NormPass(params)
    npass.host = None  # packed as steps recorded on their own are
    values = []
    for _ in range(3):
        give_grads(params)
        value, _, layout = npass.take()
        assert isinstance(value, DeviceValue) and layout is not None
        values.append(value)
    split = values[0].stack_alike(values)
    assert split is not None and split[1] is not None
    rows = squared_norms_split(*split, layout)
    alone = np.stack([squared_norms(v.floats(), layout) for v in values])
    # Alone, a step's raw float32 values are squared in float64 (joined to its float64 head).
    np.testing.assert_allclose(rows, alone, rtol=1e-6)
