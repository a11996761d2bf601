"""Measure a vision-language model's run with mlx-vlm's own trainer, in a child process
(mlxfit/measure/vision_child.py): the folder's config, tokenizer and processor files,
random weights, --data or stand-in images of --image-size, a few steps."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
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

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.peak_bytes) / self.peak_bytes if self.peak_bytes else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


def flags_of(training) -> list[str]:
    """mlx_vlm.train's flags for `training` (model/vision.py VisionTraining)."""
    t = training
    out = ["--train-type", t.train_type, "--lora-rank", str(t.lora_rank), "--batch-size", str(t.batch_size),
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


def measure(folder, run, steps: int = 3, timeout: float | None = None, on_event=lambda e: None) -> VisionMeasurement:
    """A few steps of mlx_vlm.train on `run` (model/vision_run.py VisionRun) of the model in `folder`."""
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
        done = run_child({"model": str(folder), "data": str(data), "steps": steps, "flags": flags_of(run.training)},
                         timeout, on_event, module="mlxfit.measure.vision_child")
    m = done["measured"]
    return VisionMeasurement(m["peak_bytes"], tuple(m["step_peaks_bytes"]), m["steps"], m["seconds"], tuple(m["widths"]),
                             tuple(m["vision_tokens"]), rows, run.data is None)
