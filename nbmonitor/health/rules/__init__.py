"""The rules ``Health`` runs, in the order their alerts are reported.

A new rule is a class meeting ``nbmonitor.health.rule.Rule`` (usually a ``rule.Base``
subclass) in its family's module, or a new module, plus one line here.
"""

from __future__ import annotations

from nbmonitor.health.rule import RuleFactory
from nbmonitor.health.rules.activations import DeadUnits
from nbmonitor.health.rules.clipping import ClippingActive
from nbmonitor.health.rules.decay import WeightDecayTooHigh
from nbmonitor.health.rules.devices import DeviceMemory, GpuIdle, GpuTemperature, GpuThrottling
from nbmonitor.health.rules.finetune import (
    AdapterLrTooSmall,
    AdaptersNotLearning,
    AdaptersNotTrained,
    BaseNotFrozen,
)
from nbmonitor.health.rules.gradients import (
    ExplodingGradients,
    GradientSpike,
    VanishingGradients,
)
from nbmonitor.health.rules.input_scale import InputsNotNormalised
from nbmonitor.health.rules.labels import LabelsNotMatching
from nbmonitor.health.rules.loop_order import (
    StepBeforeBackward,
    ZeroGradAfterBackward,
    ZeroGradMissing,
)
from nbmonitor.health.rules.loss import LossPlateau, LossSpike, NonFiniteLoss
from nbmonitor.health.rules.loss_graph import (
    LossDetached,
    LossSumReduction,
    SoftmaxBeforeCrossEntropy,
)
from nbmonitor.health.rules.lr import LrScheduleTooFast, LrTooHigh, LrTooLow
from nbmonitor.health.rules.memory import AllocRetries, MemoryLeak, MemoryPeak
from nbmonitor.health.rules.modes import BatchnormTinyBatch, DropoutTooHigh, EvalModeDuringTraining
from nbmonitor.health.rules.precision import Fp16ParamsWithAdam, Fp16WithoutScaler
from nbmonitor.health.rules.replicas import SameBatches
from nbmonitor.health.rules.scaler import ScalerSkipping
from nbmonitor.health.rules.stalls import RankStalled
from nbmonitor.health.rules.stragglers import Stragglers
from nbmonitor.health.rules.sync import RankDivergence
from nbmonitor.health.rules.time import InputBound, OptimizerShare, StepTimeRegression
from nbmonitor.health.rules.updates import UpdateRatioHigh, UpdateRatioLow

RULES: tuple[RuleFactory, ...] = (
    NonFiniteLoss,
    ZeroGradMissing,
    ZeroGradAfterBackward,
    StepBeforeBackward,
    LossDetached,
    SoftmaxBeforeCrossEntropy,
    LossSumReduction,
    InputsNotNormalised,
    EvalModeDuringTraining,
    BatchnormTinyBatch,
    DropoutTooHigh,
    Fp16ParamsWithAdam,
    Fp16WithoutScaler,
    ExplodingGradients,
    GradientSpike,
    VanishingGradients,
    AdaptersNotTrained,
    BaseNotFrozen,
    AdaptersNotLearning,
    AdapterLrTooSmall,
    UpdateRatioHigh,
    UpdateRatioLow,
    LrTooHigh,
    LrTooLow,
    LrScheduleTooFast,
    LabelsNotMatching,
    WeightDecayTooHigh,
    ClippingActive,
    ScalerSkipping,
    LossSpike,
    LossPlateau,
    DeadUnits,
    GpuTemperature,
    DeviceMemory,
    MemoryPeak,
    AllocRetries,
    MemoryLeak,
    GpuThrottling,
    GpuIdle,
    Stragglers,
    SameBatches,
    RankStalled,
    RankDivergence,
    InputBound,
    OptimizerShare,
    StepTimeRegression,
)

__all__ = ["RULES"]
