"""mlx-vlm's SFT (mlx_vlm.train, its `vlm` task): taken when the model's config has a
vision part, never chosen by --train-mode. Its step holds the vision tower's forward
over the images' patches and the language model's step over text + image tokens, with
mlx_vlm.train's defaults (model/vision.py VisionTraining): uncompiled, the logits cast
to float32. Estimated by estimate/vision.py, measured by measure/vision_child.py (mlx-vlm's
own trainer), its range read off benchmarks/results/vision.md."""

from __future__ import annotations

from dataclasses import dataclass

from .base import MLX_VLM, Mode


@dataclass(frozen=True)
class VLM(Mode):
    def refusal(self, *, hostfile=None, by_slice=False, skip_bad_lines=False) -> str | None:
        if hostfile:
            return "--hostfile with a vision-language model: mlxfit plans mlx_vlm.train runs for one machine"
        if skip_bad_lines:
            return "--skip-bad-lines with a vision-language model: mlx-vlm reads every row of --data"
        return None

    def estimate(self, model, run, backend, length=None, reference=None, prompt_length=None, count_new=True,
                 counted=None):
        """The step's peak, moment by moment (estimate/vision.py): `model` a VisionModelInfo,
        `run` a VisionRun."""
        from ..estimate.vision import run_estimate

        return run_estimate(model, run, backend)

    def evidence_range(self, peak_bytes: int, backend: str, counted: bool = False, kind: str | None = None):
        from ..estimate.vision import evidence_range

        return evidence_range(peak_bytes)


MODE = VLM("vlm", order=6, trainer=MLX_VLM, compiled=False, float32_scores=True, data_kind="images",
           chosen_by_model=True)
