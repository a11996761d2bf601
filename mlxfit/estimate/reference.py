"""The reference model a DPO or GRPO run loads beside the policy (mlx-lm-lora)."""

from __future__ import annotations

from dataclasses import replace

from ..model.preference import PreferenceRun
from ..model.resolve import ModelInfo
from .detailed import counted_totals


def reference_bytes(model: ModelInfo, run: PreferenceRun, reference: ModelInfo | None = None) -> int:
    """The reference copy: --model loaded again by mlx_lm.load, unquantized even
    with --load-in-4bits (only the policy is quantized), or the model at
    --reference-model-path as stored."""
    if not run.has_reference:
        return 0
    ref = reference or model
    base = replace(run.training, fine_tune_type="lora", quantize=False)
    return counted_totals(ref, base)[0]
