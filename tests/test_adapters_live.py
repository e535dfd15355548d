"""Is this fine-tune training? Real monitors on real adapters: LoRA written by hand in plain
torch, and the real peft (tiny models built from configs or by hand, no downloads). A healthy
fine-tune raises no alert and reads "adapters learning" by step 50; each failure mode of the
public reports is named by its cause."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import nbmonitor
from nbmonitor.health import Alert
from nbmonitor.health.adapters import Adapters
from nbmonitor.live.adapters import find_adapters

peft = pytest.importorskip("peft")


class HandLoRA(nn.Module):
    """A frozen base Linear and a rank-``r`` update B @ A written by hand (B from zero)."""

    def __init__(self, base: nn.Linear, r: int = 4, zero_a: bool = False) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_down = nn.Parameter(torch.randn(r, base.in_features) / base.in_features**0.5)
        self.lora_up = nn.Parameter(torch.zeros(base.out_features, r))
        if zero_a:
            nn.init.zeros_(self.lora_down)  # the bug: A and B both start at zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_down.T @ self.lora_up.T


class Pair(nn.Module):
    """LoRA under other names: a Linear ``w`` and two small Linears ``p``, ``q``."""

    def __init__(self, d: int, r: int = 4) -> None:
        super().__init__()
        self.w = nn.Linear(d, d).requires_grad_(False)
        self.p = nn.Linear(d, r, bias=False)
        self.q = nn.Linear(r, d, bias=False)
        nn.init.zeros_(self.q.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w(x) + self.q(self.p(x))


def base_mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def train(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    tmp_path: Path,
    steps: int = 80,
    sched: Any = None,
) -> tuple[list[Alert], Any, float, float]:
    """Classify a fixed task; (alerts, the verdict at step 50, first loss, last loss)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    target = torch.randn(16, 4, generator=g)
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, run_dir=tmp_path)
    verdict = None
    losses = []
    try:
        for step in range(1, steps + 1):
            x = torch.randn(32, 16, generator=g)
            loss = nn.functional.cross_entropy(model(x), (x @ target).argmax(1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            mon.log(loss=loss)
            losses.append(loss.item())
            if step == 50:
                mon.flush()
                verdict = mon.adapters()
        mon.flush()
        return mon.events(), verdict, losses[0], losses[-1]
    finally:
        mon.close()


def rules(alerts: list[Alert]) -> list[str]:
    return [a.rule for a in alerts]


def peft_mlp(**config: Any) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(
            base_mlp(), peft.LoraConfig(target_modules=["0", "2"], r=4, **config)
        )


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# -- knowing the adapters ----------------------------------------------------------------------


def test_peft_lora_layout() -> None:
    model = peft_mlp(modules_to_save=["4"])
    opt = torch.optim.AdamW(trainable(model), lr=1e-3)
    ad = find_adapters(model, opt)
    assert isinstance(ad, Adapters)
    assert ad.method == "LoRA (peft)"
    roles = {t.name.removeprefix("base_model.model."): t.role for t in ad.tensors}
    assert roles == {
        "0.lora_A.default.weight": "A",
        "0.lora_B.default.weight": "B",
        "2.lora_A.default.weight": "A",
        "2.lora_B.default.weight": "B",
        "4.modules_to_save.default.weight": "head",
        "4.modules_to_save.default.bias": "head",
    }
    assert [t.zero_start for t in ad.adapters] == [False, True, False, True]
    assert all(t.in_optimizer and t.group == 0 and t.lr == 1e-3 for t in ad.tensors)
    assert ad.count() == "4 LoRA matrices"
    assert ad.base_trainable_numel == 0 and ad.base_numel > ad.adapter_numel


def test_peft_ia3_and_prefix_layouts() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=64,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ia3 = peft.get_peft_model(
            transformers.LlamaForCausalLM(config),
            peft.IA3Config(
                task_type="CAUSAL_LM",
                target_modules=["k_proj", "v_proj", "down_proj"],
                feedforward_modules=["down_proj"],
            ),
        )
        prefix = peft.get_peft_model(
            transformers.LlamaForCausalLM(config),
            peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
        )
    ad = find_adapters(ia3, None)
    assert ad is not None and ad.method == "IA3 (peft)"
    assert {t.role for t in ad.tensors} == {"scale"} and ad.count() == "6 IA3 scales"
    ad = find_adapters(prefix, None)
    assert ad is not None and ad.method == "prefix tuning (peft)"
    assert [t.role for t in ad.tensors] == ["prompt"]


def test_hand_written_lora_by_name_and_by_structure() -> None:
    named = nn.Sequential(HandLoRA(nn.Linear(16, 16)), nn.ReLU(), HandLoRA(nn.Linear(16, 4)))
    ad = find_adapters(named, torch.optim.Adam(trainable(named)))
    assert ad is not None and ad.method == "LoRA"
    assert {t.name: t.role for t in ad.tensors} == {
        "0.lora_down": "A", "0.lora_up": "B", "2.lora_down": "A", "2.lora_up": "B",
    }  # fmt: skip
    unnamed = nn.Sequential(Pair(16), nn.ReLU(), Pair(16))
    ad = find_adapters(unnamed, torch.optim.Adam(trainable(unnamed)))
    assert ad is not None
    assert {t.name: t.role for t in ad.tensors} == {
        "0.p.weight": "A", "0.q.weight": "B", "2.p.weight": "A", "2.q.weight": "B",
    }  # fmt: skip


def test_models_without_adapters_have_none() -> None:
    model = base_mlp()
    assert find_adapters(model, torch.optim.SGD(model.parameters(), lr=0.1)) is None
    # A bottleneck is a low-rank pair beside a square weight, but nothing says adapter.
    bottleneck = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 2), nn.Linear(2, 16))
    assert find_adapters(bottleneck, torch.optim.SGD(bottleneck.parameters(), lr=0.1)) is None
    # A base partly unfrozen on purpose (most of it trains): not a fine-tune.
    model[0].requires_grad_(False)
    assert find_adapters(model, torch.optim.SGD(trainable(model), lr=0.1)) is None


# -- healthy fine-tunes: no alert, and "learning" by step 50 ----------------------------------

HealthyCase = Callable[[], tuple[nn.Module, torch.optim.Optimizer, Any]]


def _peft_adamw_all() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    # AdamW over model.parameters(): the frozen base is in the optimizer and skipped.
    model = peft_mlp(lora_dropout=0.1)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3), None


def _peft_warmup() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = peft_mlp()
    opt = torch.optim.AdamW(trainable(model), lr=3e-3)
    # Linear warm-up from lr 0 (transformers' get_linear_schedule_with_warmup).
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 10))
    return model, opt, sched


def _peft_head() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = peft_mlp(modules_to_save=["4"])
    return model, torch.optim.AdamW(trainable(model), lr=3e-3), None


def _hand_lora() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    base = base_mlp()
    model = nn.Sequential(HandLoRA(base[0]), nn.ReLU(), HandLoRA(base[2]), nn.ReLU(), base[4])
    base[4].requires_grad_(False)
    return model, torch.optim.AdamW(trainable(model), lr=3e-3), None


def _pair_sgd() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32).requires_grad_(False), nn.ReLU(), Pair(32),
                          nn.ReLU(), nn.Linear(32, 4).requires_grad_(False))  # fmt: skip
    return model, torch.optim.SGD(trainable(model), lr=0.1, momentum=0.9), None


@pytest.mark.parametrize(
    "case",
    [_peft_adamw_all, _peft_warmup, _peft_head, _hand_lora, _pair_sgd],
    ids=lambda f: f.__name__.strip("_"),
)
def test_healthy_fine_tune_raises_nothing_and_reads_learning(
    case: HealthyCase, tmp_path: Path
) -> None:
    model, opt, sched = case()
    alerts, verdict, first, last = train(model, opt, tmp_path, sched=sched)
    assert [(a.rule, a.message) for a in alerts] == []
    assert last < first  # it trained
    assert verdict is not None and verdict.state == "learning", verdict
    assert verdict.text.startswith("adapters learning: ")
    assert verdict.b_left_zero == verdict.b_zero_start > 0
    assert verdict.grads == "non-zero"


def test_without_update_measurements_the_verdict_says_what_it_knows(tmp_path: Path) -> None:
    model, opt, _ = _hand_lora()
    torch.set_num_threads(1)
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, run_dir=tmp_path,
                           layer_every=0)  # fmt: skip
    try:
        g = torch.Generator().manual_seed(1)
        for _ in range(40):
            loss = model(torch.randn(32, 16, generator=g)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
        mon.flush()
        verdict = mon.adapters()
        assert verdict is not None and verdict.state == "receiving gradients"
        assert verdict.text.endswith("their updates are not measured")
        assert mon.events() == []
    finally:
        mon.close()


def test_a_base_frozen_by_a_group_of_lr_0_is_not_stepped() -> None:
    base = base_mlp()
    model = nn.Sequential(HandLoRA(base[0]), nn.ReLU(), HandLoRA(base[2]), nn.ReLU(), base[4])
    model.requires_grad_(True)
    adapters = [p for n, p in model.named_parameters() if "lora" in n]
    rest = [p for n, p in model.named_parameters() if "lora" not in n]
    opt = torch.optim.AdamW([{"params": adapters}, {"params": rest, "lr": 0.0}], lr=1e-3)
    ad = find_adapters(model, opt)
    assert ad is not None and ad.base_stepped == () and ad.base_unstepped == ()


def test_a_model_whose_adapters_cannot_be_read_is_monitored_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbmonitor.live.monitor as live

    def broken(model: nn.Module, optimizer: object) -> None:
        raise RuntimeError("a module nbmonitor cannot read")

    monkeypatch.setattr(live, "find_adapters", broken)
    model, opt, _ = _hand_lora()
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, run_dir=tmp_path)
    try:
        for _ in range(20):
            model(torch.randn(8, 16)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        assert mon.step == 20
        assert mon.adapters() is None
        assert any("adapters" in e and "cannot read" in e for e in mon.errors)
    finally:
        mon.close()


class Bag(nn.Module):
    """Token ids -> an embedding bag -> two Linears: for peft's embedding LoRA, DoRA, IA3."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 16)
        self.fc = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(self.emb(ids).mean(1))))


def _two_adapters() -> nn.Module:
    model = peft.get_peft_model(Bag(), peft.LoraConfig(target_modules=["fc"], r=4))
    model.add_adapter("other", peft.LoraConfig(target_modules=["fc"], r=4))  # inactive, frozen
    return model


PEFT_METHODS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "embedding_lora": (
        lambda: peft.get_peft_model(Bag(), peft.LoraConfig(target_modules=["emb", "fc"], r=4)),
        "adapters learning: 4 LoRA matrices, zero-started tensors left zero in 2 of 2",
    ),
    "dora": (
        lambda: peft.get_peft_model(
            Bag(), peft.LoraConfig(target_modules=["fc", "out"], r=4, use_dora=True)
        ),
        "adapters learning: 6 DoRA tensors, B left zero in 2 of 2",
    ),
    "ia3": (
        lambda: peft.get_peft_model(
            Bag(), peft.IA3Config(target_modules=["fc", "out"], feedforward_modules=["out"])
        ),
        "adapters learning: 2 IA3 scales, weights moved",
    ),
    "two_adapters": (_two_adapters, "adapters learning: 2 LoRA matrices, B left zero in 1 of 1"),
}


@pytest.mark.parametrize("method", list(PEFT_METHODS))
def test_peft_methods_train_silently_and_read_learning(method: str, tmp_path: Path) -> None:
    make, head = PEFT_METHODS[method]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make()
    opt = torch.optim.AdamW(trainable(model), lr=3e-3)
    torch.set_num_threads(1)
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, run_dir=tmp_path)
    try:
        g = torch.Generator().manual_seed(0)
        for _ in range(60):
            ids = torch.randint(0, 50, (16, 6), generator=g)
            loss = nn.functional.cross_entropy(model(ids), ids[:, 0] % 4)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log(loss=loss)
        mon.flush()
        verdict = mon.adapters()
        assert verdict is not None and verdict.text.startswith(head), verdict
        assert [(a.rule, a.message) for a in mon.events()] == []
    finally:
        mon.close()


def test_base_partly_unfrozen_on_purpose_without_adapters_is_silent(tmp_path: Path) -> None:
    model = base_mlp()
    model[0].requires_grad_(False)
    alerts, verdict, _, _ = train(model, torch.optim.Adam(trainable(model), lr=3e-3), tmp_path)
    assert verdict is None
    assert [(a.rule, a.message) for a in alerts] == []


def test_a_frozen_backbone_with_a_trained_head_reads_as_a_trainable_part(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 4))  # fmt: skip
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)
    alerts, verdict, _, _ = train(model, torch.optim.Adam(model.parameters(), lr=3e-3), tmp_path)
    assert [(a.rule, a.message) for a in alerts] == []
    assert verdict is not None and verdict.state == "learning"
    assert verdict.text.startswith("adapters learning: 2 adapter tensors, weights moved")


def test_the_verdict_reaches_the_frame_and_the_console_summary(tmp_path: Path) -> None:
    from nbmonitor.ui.console import summary_text

    model, opt, _ = _hand_lora()
    _, verdict, _, _ = train(model, opt, tmp_path, steps=50)
    assert verdict is not None
    mon = nbmonitor.attach(model, opt, display=False, interval=0.05, run_dir=tmp_path / "again")
    try:
        assert mon.adapters() is None  # before the first health check: not judged yet
        x = torch.randn(8, 16)
        for _ in range(12):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        mon.flush()
        verdict = mon.adapters()
        assert verdict is not None and verdict.state == "learning"
        frame = mon.frame()
        assert frame.adapters == verdict.text
        assert f"  {verdict.text}" in summary_text(frame).splitlines()
    finally:
        mon.close()
    meta = json.loads((mon.run_dir / "meta.json").read_text())
    assert Adapters.from_json(meta["adapters"]) == find_adapters(model, opt)


# -- the failure modes of the public reports ---------------------------------------------------


def test_optimizer_built_before_get_peft_model_is_adapters_not_trained(tmp_path: Path) -> None:
    # peft issues: "LoRA weights not updated" with the optimizer built on the base model.
    base = base_mlp()
    opt = torch.optim.AdamW(base.parameters(), lr=3e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(base, peft.LoraConfig(target_modules=["0", "2"], r=4))
    alerts, verdict, _, _ = train(model, opt, tmp_path)
    causes = [a for a in alerts if a.rule == "adapters_not_trained"]
    assert len(causes) == 1 and causes[0].step <= 16
    assert "4 LoRA matrices not in the optimizer" in causes[0].message
    # The symptoms of adapters that never move are its evidence, not alerts of their own.
    assert rules(alerts) == ["adapters_not_trained"]
    # The cause explains the generic setup alerts: they do not stand beside it.
    assert "params_not_in_optimizer" not in rules(alerts)
    assert "frozen_params_in_optimizer" not in rules(alerts)
    assert verdict.state == "not trained"


def test_adapters_frozen_after_loading_are_adapters_not_trained(tmp_path: Path) -> None:
    # PeftModel.from_pretrained without is_trainable=True: "trainable params: 0".
    model = peft_mlp()
    model.requires_grad_(False)
    model.base_model.model[4].requires_grad_(True)  # something trains, so backward runs
    alerts, verdict, _, _ = train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), tmp_path)
    causes = [a for a in alerts if a.rule == "adapters_not_trained"]
    assert len(causes) == 1
    assert "4 LoRA matrices of 4 frozen (requires_grad=False)" in causes[0].message
    assert "frozen_params_in_optimizer" not in rules(alerts)
    assert verdict.state == "not trained"


def test_base_trained_beside_hand_written_lora_is_base_not_frozen(tmp_path: Path) -> None:
    base = base_mlp()
    model = nn.Sequential(HandLoRA(base[0]), nn.ReLU(), HandLoRA(base[2]), nn.ReLU(), base[4])
    model.requires_grad_(True)  # the bug: the base was unfrozen again
    alerts, verdict, _, _ = train(model, torch.optim.AdamW(model.parameters(), lr=3e-3), tmp_path)
    causes = [a for a in alerts if a.rule == "base_not_frozen"]
    assert len(causes) == 1 and causes[0].step <= 16
    assert set(causes[0].layers) >= {"0.base.weight", "2.base.weight"}
    assert "including the weights the adapters wrap" in causes[0].message
    assert verdict.state == "learning"  # the adapters do learn; the base trains too


def test_a_zero_a_and_zero_b_never_learn(tmp_path: Path) -> None:
    base = base_mlp()
    model = nn.Sequential(HandLoRA(base[0], zero_a=True), nn.ReLU(),
                          HandLoRA(base[2], zero_a=True), nn.ReLU(), base[4])  # fmt: skip
    alerts, verdict, _, _ = train(model, torch.optim.AdamW(trainable(model), lr=3e-3), tmp_path)
    causes = [a for a in alerts if a.rule == "adapters_not_learning"]
    assert len(causes) == 1 and causes[0].step <= 50
    assert causes[0].cause.startswith("the adapters' A and B both start at zero")
    assert verdict.state == "not learning"
    assert "grads exactly zero" in verdict.text


class Checkpointed(nn.Module):
    """A frozen embedding, a LoRA block under reentrant checkpointing, a trainable head: the
    block's input does not require grad, so no gradient reaches its adapters."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(16, 32).requires_grad_(False)
        self.block = HandLoRA(nn.Linear(32, 32))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block, self.embed(x), use_reentrant=True)
        return self.head(torch.relu(h))


def test_checkpointing_that_cuts_the_adapters_off_is_named(tmp_path: Path) -> None:
    model = Checkpointed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns "None of the inputs have requires_grad"
        alerts, verdict, _, _ = train(model, torch.optim.AdamW(trainable(model), lr=3e-3), tmp_path)
    causes = [a for a in alerts if a.rule == "adapters_not_learning"]
    assert len(causes) == 1 and causes[0].step <= 50
    assert causes[0].layers == ("block.lora_down", "block.lora_up")
    assert causes[0].cause.startswith("no gradient reaches the adapters")
    assert verdict.state == "not learning"


def test_adapter_lr_far_too_small_is_named(tmp_path: Path) -> None:
    model = peft_mlp()
    alerts, verdict, _, _ = train(model, torch.optim.AdamW(trainable(model), lr=1e-9), tmp_path)
    causes = [a for a in alerts if a.rule == "adapter_lr_too_small"]
    assert len(causes) == 1 and causes[0].step <= 50
    assert "lr 1.0e-09 (group 0)" in causes[0].message
    assert causes[0].evidence["lr"] == [1e-9]
    assert rules(alerts) == ["adapter_lr_too_small"]  # its symptoms are its evidence
    assert verdict.state == "too slow"


# -- the Hugging Face Trainer with a peft model ------------------------------------------------


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("lr", "state", "raised"),
    [(1e-4, "learning", []), (1e-9, "too slow", ["adapter_lr_too_small"])],
)
def test_trainer_on_a_peft_gpt2(lr: float, state: str, raised: list[str], tmp_path: Path) -> None:
    # The Trainer builds its optimizer inside train() (adopted at its first step), warms up
    # from lr 0 and decays linearly to 0; the adapters sit on GPT-2's fused c_attn (Conv1D).
    transformers = pytest.importorskip("transformers")
    from tests.hf_setup import quiet_args, tiny_gpt2

    from nbmonitor.integrations.hf import NbmonitorCallback

    torch.manual_seed(0)
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(
            tiny_gpt2(32, 2),
            peft.LoraConfig(target_modules=["c_attn"], r=4, lora_dropout=0.05, fan_in_fan_out=True),
        )
        args = quiet_args(tmp_path, max_steps=100, per_device_train_batch_size=4,
                          learning_rate=lr, warmup_steps=10, logging_steps=50)  # fmt: skip
        callback = NbmonitorCallback(run_dir=tmp_path / "runs", display=False, interval=0.05)
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=Tokens(400, 1), callbacks=[callback]
        )
        trainer.train()
    mon = callback.monitor
    assert mon is not None
    verdict = mon.adapters()
    assert verdict is not None and verdict.state == state, verdict
    assert verdict.tensors == 4 and verdict.method == "LoRA (peft)"
    assert rules(mon.events()) == raised
