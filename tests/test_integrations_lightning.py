"""The Lightning callback: a real Trainer (tiny LightningModule, CPU) with accumulate_grad_batches
1 and 2, with and without gradient_clip_val, and validation; nbmonitor's steps, grad_norm and loss
equal what Lightning itself had per step (a reference callback reads the gradients at
on_before_optimizer_step, before the clip, and training_step's loss as Lightning returned it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

L = pytest.importorskip("lightning")

import nbmonitor  # noqa: E402
from nbmonitor._capture import intercept  # noqa: E402
from nbmonitor.integrations.lightning import NbmonitorCallback  # noqa: E402

# Lightning's own notices (its pytree helper's deprecation, advice on dataloader workers and
# on the small batch count) are not ours to fail on.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning",
    "ignore:.*does not have many workers:UserWarning",
    "ignore:.*is smaller than the logging interval:UserWarning",
)


class Regressor(L.LightningModule):
    """training_step calls a submodule, not self(x): nbmonitor's forward hooks on the module see
    nothing, and the batches, samples and steps must still count."""

    def __init__(self, callback: NbmonitorCallback) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )
        self.callback = callback
        # Without the callback: a plain attach(self, optimizer) at the start of training.
        self.plain: dict[str, Any] | None = None
        self.plain_monitor: Any = None

    fail_at: int | None = None

    def on_train_start(self) -> None:
        if self.plain is not None:
            self.plain_monitor = nbmonitor.attach(self, self.optimizers(), **self.plain)

    def on_train_end(self) -> None:
        if self.plain_monitor is not None:
            self.plain_monitor.close()

    @property
    def monitor(self) -> Any:
        return self.plain_monitor if self.plain is not None else self.callback.monitor

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == self.fail_at:
            raise RuntimeError("a bug in training_step")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.body(x), y)
        mon = self.monitor
        assert mon is not None
        mon.log(step_seen=float(self.trainer.global_step + 1))  # the step in progress
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.body(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.2)


class Reference(L.Callback):
    """What Lightning had: the gradients' total norm as on_before_optimizer_step sees them
    (before gradient_clip_val's clip), and training_step's loss per micro-batch."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self.layer_norms: dict[str, float] = {}  # of the last step
        self.step_losses: list[float] = []
        self._micro: list[float] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))
        self.layer_norms = {n: float(p.grad.norm()) for n, p in pl_module.named_parameters()}

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # Lightning returns the loss divided by accumulate_grad_batches (for backward).
        self._micro.append(float(outputs["loss"]) * trainer.accumulate_grad_batches)
        if trainer.global_step > len(self.step_losses):  # this batch stepped
            self.step_losses.append(float(np.mean(self._micro)))
            self._micro = []


def fit(
    tmp_path: Path,
    accumulate: int,
    clip: float | None,
    fail_at: int | None = None,
    plugins: list[Any] | None = None,
    samples: int = 40,
    plain: bool = False,
    **options: Any,
) -> tuple[Any, Reference, Any]:
    """``plain``: no callback; the module attaches itself (``attach(self, self.optimizers())``)
    when training starts. ``samples``: 36 makes 9 batches of 4, an odd count."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 8, generator=gen) * 5  # large inputs: norms well above the clip
    data = torch.utils.data.TensorDataset(x, torch.randn(samples, 1, generator=gen))
    callback = NbmonitorCallback(run_dir=tmp_path / "runs", display=False, **options)
    reference = Reference()
    trainer = L.Trainer(
        max_epochs=2,
        accumulate_grad_batches=accumulate,
        gradient_clip_val=clip,
        val_check_interval=3,  # validation inside the epoch, between training steps
        limit_val_batches=2,
        accelerator="cpu",
        callbacks=[reference] if plain else [callback, reference],
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        plugins=plugins,
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    module = Regressor(callback)
    module.fail_at = fail_at
    if plain:
        module.plain = {"run_dir": tmp_path / "runs", "display": False, **options}
    trainer.fit(module, loader, torch.utils.data.DataLoader(data, batch_size=4))
    return trainer, reference, module.monitor


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plain", [False, True], ids=["callback", "plain-attach"])
def test_a_short_last_step_shows_lightnings_loss(tmp_path: Path, plain: bool) -> None:
    # 9 batches an epoch, accumulate_grad_batches=2: each epoch ends with a step of one batch,
    # whose loss Lightning divides by 2 for backward all the same. The loss shown is the mean
    # of training_step's losses on every step, the short ones included.
    trainer, reference, mon = fit(tmp_path, 2, None, samples=36, plain=plain)
    assert mon is not None and mon.status == "closed" and not mon.errors
    h = mon.history()
    assert trainer.global_step == mon.step == 10
    assert h["micro_batches"].tolist() == [2, 2, 2, 2, 1] * 2
    np.testing.assert_allclose(h["loss"], reference.step_losses, rtol=1e-4)
    np.testing.assert_allclose(h["grad_norm"], reference.norms, rtol=1e-4)


@pytest.mark.timeout(600)
def test_a_plain_attach_in_the_module_gives_the_callbacks_numbers(tmp_path: Path) -> None:
    # attach(self, self.optimizers()) inside the LightningModule, no callback: training_step
    # never calls the module itself, and still its batches, samples and logged values count as
    # with the callback.
    trainer, reference, plain = fit(tmp_path / "plain", 2, 0.5, plain=True)
    _, _, callback = fit(tmp_path / "callback", 2, 0.5)
    assert plain.status == "closed" and not plain.errors
    p, c = plain.history(), callback.history()
    assert p["step"].tolist() == c["step"].tolist() == list(range(1, 11))
    for key in ("micro_batches", "samples", "loss", "grad_norm"):
        np.testing.assert_allclose(p[key], c[key], rtol=1e-5, err_msg=key)
    assert p["samples"].tolist() == [8.0] * 10
    assert (p["samples_per_s"] > 0).all()
    np.testing.assert_allclose(p["loss"], reference.step_losses, rtol=1e-4)
    # mon.log inside training_step belongs to the step in progress.
    assert p["step_seen"].tolist() == p["step"].tolist()
    # Put back at close: the module's training_step is its class's again.
    assert "training_step" not in trainer.lightning_module.__dict__


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("accumulate", "clip"), [(1, 0.5), (2, None), (2, 0.5)])
def test_steps_grad_norm_and_loss_are_lightnings(
    tmp_path: Path, accumulate: int, clip: float | None
) -> None:
    trainer, reference, mon = fit(tmp_path, accumulate, clip)
    assert mon is not None and mon.status == "closed" and not mon.errors
    h = mon.history()
    steps = 20 // accumulate
    assert trainer.global_step == mon.step == steps  # validation added no step
    assert h["step"].tolist() == list(range(1, steps + 1))
    assert h["micro_batches"].tolist() == [accumulate] * steps
    # The batch's samples count although training_step never calls the module itself.
    assert (h["samples_per_s"][1:] > 0).all()
    # Pre-clip and after the last micro-batch's backward: Lightning's own gradients.
    np.testing.assert_allclose(h["grad_norm"], reference.norms, rtol=1e-4)
    np.testing.assert_allclose(h["loss"], reference.step_losses, rtol=1e-4)
    # Per layer too (the last step's), before the clip.
    layers = {row["name"]: row["grad_norm"] for row in mon.layers()}
    assert layers.keys() == reference.layer_norms.keys()
    for name, norm in reference.layer_norms.items():
        assert layers[name] == pytest.approx(norm, rel=1e-4), name
    # mon.log inside training_step belongs to the step in progress.
    assert h["step_seen"].tolist() == h["step"].tolist()
    if clip is not None:
        assert (np.asarray(reference.norms) > clip).all()  # the clip acted on every step
        np.testing.assert_allclose(h["grad_clip_coef"], clip / (h["grad_norm"] + 1e-6), rtol=1e-4)
    else:
        assert "grad_clip_coef" not in h or np.isnan(h["grad_clip_coef"]).all()


@pytest.mark.timeout(300)
def test_an_exception_in_training_closes_the_monitor(tmp_path: Path) -> None:
    before = intercept.listening()
    with pytest.raises(RuntimeError, match="a bug in training_step"):
        fit(tmp_path, 1, 0.5, fail_at=3)
    [path] = (tmp_path / "runs").iterdir()
    run = nbmonitor.open(path)
    assert run.status == "closed" and run.history()["step"].tolist() == [1, 2, 3]
    assert intercept.listening() == before  # no hook left behind


@pytest.mark.timeout(300)
def test_fp16_with_a_grad_scaler(tmp_path: Path) -> None:
    # Lightning's 16-mixed runs the closure outside optimizer.step, unscales, then steps through
    # the scaler (forced onto the CPU here). Its norms are of the unscaled gradients; the steps it
    # skipped for inf gradients are step_skipped, without norms, not explosions.
    from lightning.pytorch.plugins import MixedPrecision

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    plugins = [MixedPrecision("16-mixed", "cpu", scaler=scaler)]
    trainer, reference, mon = fit(tmp_path, 2, None, plugins=plugins)
    h = mon.history()
    norms = np.asarray(reference.norms)
    assert trainer.global_step == mon.step == 10 and not mon.errors
    skipped = ~np.isfinite(norms)
    assert skipped.any() and (h["step_skipped"][skipped] == 1).all()
    assert np.isnan(h["grad_norm"][skipped]).all()
    np.testing.assert_allclose(h["grad_norm"][~skipped], norms[~skipped], rtol=1e-4)
    np.testing.assert_allclose(h["loss"], reference.step_losses, rtol=1e-4)


@pytest.mark.timeout(300)
def test_the_callback_exports(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    pd = pytest.importorskip("pandas")
    _, _, mon = fit(tmp_path, 1, None, export=["tensorboard", "csv"])
    assert mon.status == "closed" and not mon.errors
    assert sorted(p.name for p in (mon.run_dir / "tensorboard").iterdir())[-1] == "train"
    history = pd.read_csv(mon.run_dir / "csv" / "history.csv")
    assert history["step"].tolist() == mon.history()["step"].tolist() == list(range(1, 21))
