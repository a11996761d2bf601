"""mlx-lm's SFT (mlx_lm.lora): the detailed estimate by method (LoRA, QLoRA, full), one
phase, its remedies (mlxfit/estimate/remedies.py), measured by mlxfit/measure/child.py."""

from __future__ import annotations

from dataclasses import dataclass

from .base import MLX_LM, Mode


@dataclass(frozen=True)
class SFT(Mode):
    def evidence_range(self, peak_bytes: int, backend: str, counted: bool = False, kind: str | None = None):
        """The detailed estimate's range on SFT's evidence (`kind`: uncertainty.run_kind)."""
        from ..estimate.uncertainty import predicted_range

        return predicted_range(peak_bytes, backend, kind=kind)


MODE = SFT("sft", order=0, trainer=MLX_LM)
