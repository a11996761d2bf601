"""Measure a vision-language model's run with mlx-vlm's own trainer, in a child process
(mlxfit/measure/vision_child.py): the folder's config, tokenizer and processor files,
random weights, --data or stand-in images of --image-size, a few steps."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import MlxfitError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class VisionMeasurement:
    peak_bytes: int
    step_peaks_bytes: tuple
    steps: int
    seconds: float
    widths: tuple  # the model's input per example, step by step
    vision_tokens: tuple
    rows: int  # the rows the trainer read
    stand_in: bool  # images of --image-size written for the measurement (no --data)
    predicted_bytes: int = 0  # the estimate of the run measured (its width and rows)
    method: str = "whole"  # or "slice": peak_bytes extrapolated from slices of the language model
    slice: dict | None = None  # the slices: their language blocks, peaks and the plan (measure_by_slices)

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.peak_bytes) / self.peak_bytes if self.peak_bytes else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


def flags_of(training) -> list[str]:
    """mlx_vlm.train's flags for `training` (model/vision.py VisionTraining)."""
    t = training
    out = ["--train-type", t.train_type, "--lora-rank", str(t.lora_rank), "--lora-dropout", str(t.lora_dropout),
           "--batch-size", str(t.batch_size),
           "--max-seq-length", str(t.max_seq_length), "--optimizer", t.optimizer,
           "--gradient-accumulation-steps", str(t.gradient_accumulation_steps)]
    out += ["--cache-size", "none" if t.cache_size is None else str(t.cache_size)]
    return out + (["--grad-checkpoint"] if t.grad_checkpoint else []) + (["--train-vision"] if t.train_vision else [])


def write_stand_in_data(folder: Path, size: tuple, images: int, rows: int, words: int) -> Path:
    """train.jsonl of `rows` rows, each `images` random images of `size` (width, height)
    and an answer of `words` words, in mlx-vlm's format."""
    import json

    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(rows):
        paths = [f"image{i}_{j}.png" for j in range(images)]
        for path in paths:
            Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(folder / path)
        content = [*([{"type": "image"}] * images), {"type": "text", "text": "describe the picture"}]
        lines.append({"images": paths, "messages": [{"role": "user", "content": content},
                                                    {"role": "assistant", "content": " ".join(["word"] * words)}]})
    (folder / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def measure(folder, run, steps: int = 3, timeout: float | None = None, on_event=lambda e: None,
            language_blocks: int | None = None) -> VisionMeasurement:
    """A few steps of mlx_vlm.train on `run` (model/vision_run.py VisionRun) of the model in `folder`;
    with `language_blocks`, of the model with its language model cut to that many blocks."""
    from ..model.vision import require_mlx_vlm
    from .parent import run_child

    require_mlx_vlm()
    folder = Path(folder).resolve() if folder else None  # the child runs in a folder of its own
    if folder is None or not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise MlxfitError("--measure of a vision-language model needs a local folder with its config.json, "
                          "tokenizer and processor files (no weights needed)")
    with tempfile.TemporaryDirectory(prefix="mlxfit-vlm-data-") as tmp:
        rows = len(run.data.examples) if run.data else 2 * run.training.batch_size
        data = Path(run.data.path).resolve() if run.data else write_stand_in_data(
            Path(tmp), run.image_size, run.images, rows, max(1, run.text_tokens - 16))
        request = {"model": str(folder), "data": str(data), "steps": steps, "flags": flags_of(run.training),
                   "language_blocks": language_blocks}
        done = run_child(request, timeout, on_event, module="mlxfit.measure.vision_child")
    m = done["measured"]
    return VisionMeasurement(m["peak_bytes"], tuple(m["step_peaks_bytes"]), m["steps"], m["seconds"], tuple(m["widths"]),
                             tuple(m["vision_tokens"]), rows, run.data is None)


MARGIN = 1.1  # the whole run's peak moment leads a slice's other moments by this much (vision.md's range: 0.87-1.08)


def slice_plan(info, run):
    """The slices of a VLM's language model (mlxfit/measure/slicing.py plan_slices), every
    block trained (mlx-vlm's LoRA wraps every block's linears; full trains them all). The
    vision tower, projector, embedding, head and logits are whole in each slice, so a
    shallow slice's peak can be another moment than the whole run's (the vision tower's,
    not the language model's): the base slice is the shallowest whose estimate peaks at
    the whole run's moment, ahead of the others by MARGIN, so that the slices grow by
    the blocks the whole run adds."""
    from ..estimate.vision import run_estimate
    from ..model.training import TrainingConfig
    from .slicing import period, plan_slices

    if info.language is None or info.language.architecture is None:
        raise MlxfitError(f"mlx-lm has no model for {info.model_type}'s language model, so its blocks cannot be "
                          "sliced: it can only be measured whole (--force)")
    arch = info.language.architecture
    whole = _moments(run_estimate(info, run))
    kind = _kind(max(whole, key=whole.get))
    p = period(arch.blocks)
    for least in range(p, arch.num_layers, p):
        cut = _moments(slice_estimate(info, run, least))
        peak = max(cut, key=cut.get)
        others = [v for k, v in cut.items() if _kind(k) != kind]
        if _kind(peak) == kind and cut[peak] >= MARGIN * max(others, default=0):
            return plan_slices(arch, TrainingConfig(num_layers=-1), least=least)
    raise MlxfitError(f"no slice of the {arch.num_layers} language blocks peaks where the whole run does "
                      f"({kind}): it can only be measured whole (--force)")


def _kind(moment: str) -> str:
    """The language model's moments (at its loss, at a block) grow with its blocks alike."""
    return "language model" if moment.startswith("language model") else moment


def slice_estimate(info, run, blocks: int):
    """The estimate of `run` on the model with its language model cut to `blocks` blocks."""
    from ..estimate.vision import run_estimate
    from ..model.vision import vision_model, with_language_blocks

    return run_estimate(vision_model(with_language_blocks(info.config, blocks), "slice"), run)


def _moments(estimate) -> dict:
    return {name: sum(parts.values()) for name, parts in estimate.breakdown.moments.items()}


def measure_by_slices(folder, run, plan, steps: int = 3, timeout: float | None = None,
                      on_event=lambda e: None) -> VisionMeasurement:
    """mlx_vlm.train on the model with its language model cut to each slice's blocks of
    `plan` (slice_plan),
    each in a child of its own, as measure() runs the whole; the whole run's peak is
    extrapolated by the slices' increase per block (slicing.py SlicePlan.extrapolate).
    mlx-vlm's trainer runs each slice as it runs the whole (none is synchronous)."""
    measured = [measure(folder, run, steps, timeout, on_event, language_blocks=s.blocks) for s in plan.slices]
    anchor = measured[plan.slices.index(plan.as_run)]
    return replace(anchor, peak_bytes=plan.extrapolate([m.peak_bytes for m in measured]), step_peaks_bytes=(),
                   seconds=sum(m.seconds for m in measured), method="slice",
                   slice={**plan.to_dict(), "blocks": [{"blocks": s.blocks, "trained": s.trained} for s in plan.slices],
                          "peaks_bytes": [m.peak_bytes for m in measured],
                          "peak_bytes": max(m.peak_bytes for m in measured),
                          "how": f"slices of {', '.join(str(s.blocks) for s in plan.slices)} of the "
                                 f"{plan.total} language blocks (every block trained)"})
