"""A vision-language model's run as mlx_vlm.train would take it: mlxfit's training flags
in mlx_vlm.train's names (VisionTraining), the images of its widest batch (from --data in
mlx-vlm's format, or `--image-size` and `--images-per-example` standing in) and the
family's image rule, read from the folder's processor files."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import BadInput
from .images import QwenRules, Rules, image_rules, parse_image_size, pixel_values_shape, shipped_image_rules, stand_in_images
from .vision import VisionTraining

# mlxfit's flag -> mlx_vlm.train's (build_parser): the flags a VLM's step takes.
FLAGS = {"fine_tune_type": "train_type", "rank": "lora_rank", "dropout": "lora_dropout", "batch_size": "batch_size",
         "max_seq_length": "max_seq_length", "grad_checkpoint": "grad_checkpoint", "optimizer": "optimizer",
         "grad_accumulation_steps": "gradient_accumulation_steps", "train_vision": "train_vision",
         "cache_size": "cache_size"}
IMAGE_FLAGS = ("image_size", "images_per_example")


@dataclass(frozen=True)
class VisionRun:
    spec: object  # the mode (mlxfit/modes/)
    training: VisionTraining
    tokens: int  # the widest batch's longest example: text + image tokens
    image_tokens: int
    images: int  # images of that example
    pixel_shape: tuple  # its pixel_values, as the processor makes them
    rows: int | None  # the data's rows (None: no --data, as many as --cache-size)
    image_size: tuple | None = None  # (width, height) standing in without --data
    size_is_default: bool = False
    data: object = None  # model.image_data.ImageData
    notes: list = field(default_factory=list)
    rules: object = None  # the family's image rule (model/images.py) the images were counted by

    @property
    def mode(self) -> str:
        return self.spec.name

    @property
    def text_tokens(self) -> int:
        return max(self.tokens - self.image_tokens, 0)

    def to_dict(self) -> dict:
        return {"mode": self.mode, "command": self.spec.command, "training": self.training.to_dict(),
                "tokens": self.tokens, "text_tokens": self.text_tokens, "image_tokens": self.image_tokens,
                "images_per_example": self.images, "image_size": list(self.image_size) if self.image_size else None,
                "image_size_is_default": self.size_is_default, "pixel_values_shape": list(self.pixel_shape),
                "rows": self.rows}


def training_of(settings: dict) -> VisionTraining:
    """mlxfit's flags given (None: not given) in mlx_vlm.train's names; the others refused."""
    given = {k: v for k, v in settings.items() if v is not None and v is not False}
    other = sorted(set(given) - set(FLAGS) - set(IMAGE_FLAGS))
    if other:
        raise BadInput(f"--{other[0].replace('_', '-')} is not an mlx_vlm.train flag: a vision-language model is "
                       f"trained by mlx_vlm.train (its flags here: {', '.join('--' + k.replace('_', '-') for k in FLAGS)})")
    values = {FLAGS[k]: v for k, v in given.items() if k in FLAGS}
    if "cache_size" in values:
        values["cache_size"] = cache_size(values["cache_size"])
    return VisionTraining(**values)


def cache_size(value) -> int | None:
    """--cache-size as mlx_vlm.train reads it (build_parser: "none" is None, no limit;
    CoreTrainingArgs.validate refuses a negative size)."""
    text = str(value).strip()
    if text.lower() == "none":
        return None
    if not text.isdigit():
        raise BadInput(f"--cache-size {value}: give the processed rows mlx_vlm.train keeps, a whole number (0 or more) "
                       "or none (no limit)")
    return int(text)


def rules_of(config: dict, folder: Path | None, model_id: str) -> Rules:
    """The family's image rule from the folder's preprocessor_config.json and
    processor_config.json, else the facts mlxfit ships for `model_id`, else the defaults."""
    if folder is not None and Path(folder).is_dir():
        pre = _json(Path(folder) / "preprocessor_config.json")
        return image_rules(config, {**pre, "processor": _json(Path(folder) / "processor_config.json")})
    return shipped_image_rules(model_id) or image_rules(config)


def _json(path: Path) -> dict:
    from .resolve import read_config_file

    return read_config_file(path) if path.is_file() else {}


def resolve_run(spec, config: dict, folder, model_id: str, settings: dict, data=None,
                max_pixels: int | None = None) -> VisionRun:
    """The run: `settings` are probe's training flags with `image_size` ("WxH") and
    `images_per_example`; with `data` (mlx-vlm's JSONL) its widest batch. `max_pixels`: a
    Qwen family's processor capped there (its preprocessor_config.json's max_pixels)."""
    training = training_of(settings)
    rules = rules_of(config, folder, model_id)
    if max_pixels is not None and isinstance(rules, QwenRules):
        rules = replace(rules, max_pixels=max_pixels)
    size = settings.get("image_size")
    count = settings.get("images_per_example")
    if data:
        for flag, value in (("--image-size", size), ("--images-per-example", count)):
            if value is not None:
                raise BadInput(f"{flag} with --data: the images of --data are counted; leave {flag} out")
        return _from_data(spec, training, rules, data)
    images = stand_in_images(rules, parse_image_size(size) if size else None, 1 if count is None else count)
    notes = []
    if images.tokens >= training.max_seq_length:
        notes.append(f"{images.tokens} image tokens per example pass --max-seq-length {training.max_seq_length}: "
                     "mlx-vlm stops the run with a ValueError rather than cut an image (raise --max-seq-length)")
    if training.cache_size is None:
        notes.append("--cache-size none keeps every processed row; without --data they are counted as 32 rows "
                     "(give --data to count its rows)")
    grids = [images.grid] * images.images
    return VisionRun(spec, training, max(training.max_seq_length, images.tokens), images.tokens, images.images,
                     pixel_values_shape(rules, grids), None, images.size, images.size_is_default, notes=notes,
                     rules=rules)


def _from_data(spec, training: VisionTraining, rules: Rules, data) -> VisionRun:
    from .image_data import read_image_data

    read = read_image_data(data, rules, max_seq_length=training.max_seq_length, batch_size=training.batch_size)
    kept = [e for e in read.examples if e.status != "refused"] or list(read.examples)
    widest = max(kept, key=lambda e: (e.tokens, e.image_tokens))
    heaviest = max(kept, key=lambda e: e.image_tokens)
    grids = [rules.grid(w, h) for w, h in heaviest.image_sizes]
    notes = []
    if read.refused:
        notes.append(f"mlx-vlm stops at rows {_rows(read.refused)} of --data: their images pass --max-seq-length "
                     f"{training.max_seq_length} (collate_vlm_batch raises rather than cut an image)")
    if read.truncated:
        notes.append(f"rows {_rows(read.truncated)} of --data are cut to --max-seq-length {training.max_seq_length}")
    tokens = read.widest.length if read.widest else min(widest.tokens, training.max_seq_length)
    image_tokens = read.widest.image_tokens if read.widest else widest.image_tokens
    return VisionRun(spec, training, tokens, image_tokens, len(heaviest.image_sizes),
                     pixel_values_shape(rules, grids), len(read.examples), data=read, notes=notes, rules=rules)


def _rows(indexes) -> str:
    shown = ", ".join(str(i + 1) for i in indexes[:8])
    return shown + (f" and {len(indexes) - 8} more" if len(indexes) > 8 else "")


def folder_config(spec) -> tuple[dict, Path] | None:
    """(config.json, folder) of a local --model that is a folder or a config.json file."""
    path = Path(str(spec)).expanduser() if spec else None
    if path is None or not path.exists():
        return None
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        return None
    from .resolve import read_config_file

    config = read_config_file(file)
    return (config, path if path.is_dir() else path.parent) if isinstance(config, dict) else None


