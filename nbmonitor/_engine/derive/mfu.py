"""Throughput in FLOPs: training FLOPs per step, achieved TFLOP/s and MFU (model FLOPs
utilisation: achieved FLOP/s over the device's peak for the precision used).

Pure Python, no torch: the capture side counts one forward's FLOPs once (``FlopsRecord``);
this module scales that count to each step and divides by its time. The peak table holds the
dense (no sparsity) tensor-core figures of the vendors' datasheets; ``docs/throughput.md`` gives the
source of each row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

T = 1e12

# Peak FLOP/s by device and compute precision (dense; "tfloat32": float32 through TF32 tensor
# cores). A precision missing from a row has no peak known here: MFU is then not shown.
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"float32": 67 * T, "tfloat32": 494.7 * T, "bfloat16": 989.4 * T,
                 "float16": 989.4 * T, "float8": 1978.9 * T},
    "H100 PCIe": {"float32": 51.2 * T, "tfloat32": 378 * T, "bfloat16": 756 * T,
                  "float16": 756 * T, "float8": 1513 * T},
    "H100 NVL": {"float32": 60 * T, "tfloat32": 417.5 * T, "bfloat16": 835.5 * T,
                 "float16": 835.5 * T, "float8": 1670.5 * T},
    "GH200": {"float32": 67 * T, "tfloat32": 494.7 * T, "bfloat16": 989.4 * T,
              "float16": 989.4 * T, "float8": 1978.9 * T},
    "H200": {"float32": 67 * T, "tfloat32": 494.7 * T, "bfloat16": 989.4 * T,
             "float16": 989.4 * T, "float8": 1978.9 * T},
    "H200 NVL": {"float32": 60 * T, "tfloat32": 417.5 * T, "bfloat16": 835.5 * T,
                 "float16": 835.5 * T, "float8": 1670.5 * T},
    "B200": {"tfloat32": 1125 * T, "bfloat16": 2250 * T, "float16": 2250 * T,
             "float8": 4500 * T},
    "GB200": {"tfloat32": 1250 * T, "bfloat16": 2500 * T, "float16": 2500 * T,
              "float8": 5000 * T},
    "A100": {"float32": 19.5 * T, "tfloat32": 156 * T, "bfloat16": 312 * T, "float16": 312 * T},
    "L40S": {"float32": 91.6 * T, "tfloat32": 183 * T, "bfloat16": 362.05 * T,
             "float16": 362.05 * T, "float8": 733 * T},
    "L4": {"float32": 30.3 * T, "tfloat32": 60 * T, "bfloat16": 121 * T, "float16": 121 * T,
           "float8": 242.5 * T},
    "A10G": {"float32": 31.2 * T, "tfloat32": 62.5 * T, "bfloat16": 125 * T, "float16": 125 * T},
    "T4": {"float32": 8.1 * T, "float16": 65 * T},
    "RTX 4090": {"float32": 82.6 * T, "tfloat32": 82.6 * T, "bfloat16": 165.2 * T,
                 "float16": 165.2 * T},
    "RTX 3090": {"float32": 35.6 * T, "tfloat32": 35.6 * T, "bfloat16": 71 * T, "float16": 71 * T},
    "Apple M1": {"float32": 2.6 * T},
    "Apple M1 Pro": {"float32": 5.2 * T},
    "Apple M1 Max": {"float32": 10.4 * T},
    "Apple M1 Ultra": {"float32": 21 * T},
    "Apple M2": {"float32": 3.6 * T},
    "Apple M2 Pro": {"float32": 6.8 * T},
    "Apple M2 Max": {"float32": 13.6 * T},
    "Apple M2 Ultra": {"float32": 27.2 * T},
}  # fmt: skip

# Device names as backends report them (torch.cuda.get_device_name, the Mac's chip), matched
# lowercased, first match wins: the more specific pattern comes first.
_MATCH: tuple[tuple[str, str], ...] = (
    (r"gh200", "GH200"),
    (r"gb200", "GB200"),
    (r"h100.*nvl", "H100 NVL"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100", "H100 SXM"),
    (r"h200.*nvl", "H200 NVL"),
    (r"h200", "H200"),
    (r"b200", "B200"),
    (r"a100", "A100"),
    (r"l40s", "L40S"),
    (r"\bl4\b", "L4"),
    (r"a10g", "A10G"),
    (r"\bt4\b", "T4"),
    (r"rtx 4090(?! d)", "RTX 4090"),
    (r"rtx 3090(?! ti)", "RTX 3090"),
    (r"apple m([12]) ultra", "Apple M{} Ultra"),
    (r"apple m([12]) max", "Apple M{} Max"),
    (r"apple m([12]) pro", "Apple M{} Pro"),
    (r"apple m([12])\b", "Apple M{}"),
)

# A training step computes about three forwards' worth: the backward pass takes the
# gradients of both the inputs and the weights of each product (the 6N rule's 2N + 4N).
TRAINING_FACTOR = 3.0


def device_key(name: str | None) -> str | None:
    """The row of ``PEAK_FLOPS`` a device name falls in, or None for a device not listed."""
    if not name:
        return None
    text = name.lower()
    for pattern, key in _MATCH:
        found = re.search(pattern, text)
        if found:
            return key.format(*found.groups())
    return None


def precision(dtype: str) -> str:
    """A dtype name as the peak table spells it (``float8_e4m3fn`` -> ``float8``)."""
    return "float8" if dtype.startswith("float8") else dtype


def peak_flops(device: str | None, dtype: str) -> tuple[float, str]:
    """The device's peak FLOP/s for ``dtype``, and "" ; or NaN and why it is not known."""
    key = device_key(device)
    shown = device or "this device"
    if key is None:
        return math.nan, (
            f"MFU is not shown: nbmonitor has no peak FLOP/s for {shown} "
            "(TFLOP/s is still measured)."
        )
    peak = PEAK_FLOPS[key].get(precision(dtype))
    if peak is None:
        known = ", ".join(PEAK_FLOPS[key])
        return math.nan, (
            f"MFU is not shown: nbmonitor has no {dtype} peak for the {key} (known: {known}); "
            "TFLOP/s is still measured."
        )
    return peak, ""


def mfu_percent(flops_per_s: float, peak: float) -> float:
    """Achieved FLOP/s as a percentage of ``peak`` (NaN when either is unknown)."""
    if not (math.isfinite(flops_per_s) and math.isfinite(peak)) or peak <= 0:
        return math.nan
    return 100.0 * flops_per_s / peak


def transformer_flops_per_token(
    n_params: float, n_layers: int, hidden: int, seq_len: int, embedding_params: float = 0.0
) -> float:
    """Training FLOPs per token of a decoder-only transformer, by formula: 6 x the parameters
    that multiply (all but the embedding lookup), plus 12 x layers x hidden x sequence length
    for the attention scores and their weighted sum, forward and backward, over the whole
    sequence as dense kernels compute them (torchtitan halves the attention term for a causal
    mask; Megatron and ``FlopCounterMode`` do not)."""
    return 6.0 * (n_params - embedding_params) + 12.0 * n_layers * hidden * seq_len


@dataclass(frozen=True)
class StepFlops:
    """Training FLOPs per token and per sample from one counted forward, and the peak that
    MFU is taken against (NaN with ``note`` saying why when unknown)."""

    per_token: float
    per_sample: float
    peak: float
    note: str

    @classmethod
    def from_count(
        cls, forward_flops: float, tokens: int, samples: int, dtype: str, device: str | None
    ) -> StepFlops:
        training = TRAINING_FACTOR * forward_flops
        peak, note = peak_flops(device, dtype)
        return cls(
            per_token=training / tokens if tokens > 0 else math.nan,
            per_sample=training / samples if samples > 0 else math.nan,
            peak=peak,
            note=note,
        )

    def step_values(self, tokens: float, samples: float, step_time: float) -> dict[str, float]:
        """``flops_per_step``, ``tflops_per_s`` and ``mfu_percent`` of one step ({} when it
        had neither tokens nor samples to scale the count by)."""
        if tokens > 0 and math.isfinite(self.per_token):
            flops = self.per_token * tokens
        elif samples > 0 and math.isfinite(self.per_sample):
            flops = self.per_sample * samples
        else:
            return {}
        rate = flops / step_time if step_time > 0 else math.nan
        return {
            "flops_per_step": flops,
            "tflops_per_s": rate / T,
            "mfu_percent": mfu_percent(rate, self.peak),
        }

    def step_columns(
        self, tokens: Sequence[float], samples: Sequence[float], step_times: Sequence[float]
    ) -> dict[str, list[float]] | None:
        """``step_values`` of several steps as columns, the same numbers: {} when no step has
        them, None when some have and some have not."""
        per_token = self.per_token if math.isfinite(self.per_token) else None
        per_sample = self.per_sample if math.isfinite(self.per_sample) else None
        flops = [
            per_token * t
            if t > 0 and per_token is not None
            else per_sample * s
            if s > 0 and per_sample is not None
            else None
            for t, s in zip(tokens, samples, strict=True)
        ]
        missing = flops.count(None)
        if missing == len(flops):
            return {}
        if missing:
            return None
        nan, peak = math.nan, self.peak
        rates = [f / t if t > 0 else nan for f, t in zip(flops, step_times, strict=True)]  # type: ignore[operator]
        mfu = [mfu_percent(r, peak) for r in rates]
        return {
            "flops_per_step": flops,  # type: ignore[dict-item]
            "tflops_per_s": [r / T for r in rates],
            "mfu_percent": mfu,
        }
