"""The tiny Hugging Face set-up the Trainer tests share: a GPT-2 built from a config (no
downloads) and TrainingArguments for a quiet CPU run (no reports, no progress bar, no
checkpoints unless asked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers


def tiny_gpt2(width: int = 16, layers: int = 1) -> Any:
    """A GPT-2 of 64 tokens and 16 positions, ``layers`` blocks of ``width``."""
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=width, n_layer=layers, n_head=2
    )
    return transformers.GPT2LMHeadModel(config)


def quiet_args(tmp_path: Path, **options: Any) -> Any:
    """TrainingArguments writing under ``tmp_path / "out"``, on the CPU, with ``options``."""
    defaults: dict[str, Any] = {
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
    }
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), **{**defaults, **options}
    )
