"""How many tokens and vision patches one image becomes, family by family.

Each family's rule is the processor's own, as mlx-vlm 0.7.10 loads it for training
(`mlx_vlm/models/<family>/processing_*.py`) and transformers' image processors it
builds (the torch-free `image_processing_pil_*.py`); docs/vision.md lists them.
The rules read the processor facts a checkpoint ships (`preprocessor_config.json`,
`processor_config.json`) and config.json's `vision_config`, with the defaults the
processors fall back on. Nothing here imports mlx-vlm or transformers: the counts
are arithmetic, pinned by tests/test_images.py against the real processors run on
real images.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import BadInput

# A stand-in for dynamic-resolution families (their processor has no size of its
# own): a 4:3 photo, as a phone's camera takes it, downsized to 1024 wide.
PHOTO_SIZE = (1024, 768)


@dataclass(frozen=True)
class ImageGrid:
    """One image as the model sees it.

    `tokens`: image placeholder tokens in the language model's sequence (what the
    processor expands the image marker into); `patches`: the vision tower's patches
    over all its views (before any merging or pooling); `pixel_shape`: (height,
    width) of each view the tower is fed; `views`: how many (tiles and a global
    view for tiling families, else 1)."""

    tokens: int
    patches: int
    pixel_shape: tuple[int, int]
    views: int = 1


@dataclass(frozen=True)
class QwenRules:
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL: `smart_resize` to a multiple of patch × merge,
    between min and max pixels; one token per merge² patches
    (mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py: Qwen3VLImageProcessor)."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    family: str = "qwen"

    def grid(self, width: int, height: int) -> ImageGrid:
        h, w = _smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
        patches = (h // self.patch_size) * (w // self.patch_size)
        return ImageGrid(patches // self.merge_size**2, patches, (h, w))

    @property
    def default_size(self) -> tuple[int, int]:
        return PHOTO_SIZE


@dataclass(frozen=True)
class FixedRules:
    """One fixed-size view, a fixed number of tokens: Gemma 3 (896², 256 tokens
    pooled from 4096 patches), PaliGemma ((image_size / patch)² tokens), LLaVA-1.5
    (CLIP's 336² crop: (336 / 14)² patches, +1 CLS, −1 with the "default" feature
    strategy = 576)."""

    tokens: int
    pixel_shape: tuple[int, int]
    patch_size: int
    family: str

    def grid(self, width: int, height: int) -> ImageGrid:
        _positive(width, height)
        h, w = self.pixel_shape
        return ImageGrid(self.tokens, (h // self.patch_size) * (w // self.patch_size), self.pixel_shape)

    @property
    def default_size(self) -> tuple[int, int]:
        h, w = self.pixel_shape
        return (w, h)


@dataclass(frozen=True)
class TileRules:
    """Idefics3 and SmolVLM: the longest edge is scaled to `longest_edge` (up or
    down), then to multiples of the tile size, cut into tiles of `tile` pixels plus
    one global view; `image_seq_len` tokens per view
    (transformers/models/idefics3/image_processing_pil_idefics3.py, smolvlm's the same;
    mlx_vlm/models/idefics3/processing_idefics3.py expands the prompt)."""

    longest_edge: int
    tile: int
    image_seq_len: int
    patch_size: int
    splitting: bool = True
    family: str = "idefics3"

    def grid(self, width: int, height: int) -> ImageGrid:
        _positive(width, height)
        views = 1
        if self.splitting:
            h, w = _rescale_to_max_len(height, width, self.longest_edge)
            h, w = _scale_below_upper_bound(h, w, MAX_IMAGE_SIZE)
            h, w = _tile_multiples(h, w, self.tile)
            if h > self.tile or w > self.tile:
                views = (h // self.tile) * (w // self.tile) + 1
        per_view = (self.tile // self.patch_size) ** 2
        return ImageGrid(self.image_seq_len * views, per_view * views, (self.tile, self.tile), views)

    @property
    def default_size(self) -> tuple[int, int]:
        return PHOTO_SIZE


Rules = QwenRules | FixedRules | TileRules

MAX_IMAGE_SIZE = 4096  # transformers' idefics3/smolvlm image processors: MAX_IMAGE_SIZE

# mlx-vlm's fallbacks when a checkpoint does not say (processing_qwen3_vl.py:
# Qwen3VLImageProcessor's defaults; the Qwen2/2.5 processors pass patch 14, Qwen3 16).
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 14 * 14 * 4 * 1280
QWEN_PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16}


def image_rules(config: dict, processor: dict | None = None) -> Rules:
    """The image rule of a VLM: `config` is its config.json, `processor` its
    `preprocessor_config.json` with `processor_config.json`'s keys added under
    "processor" (as `processor_facts` merges them)."""
    processor = processor or {}
    model_type = config.get("model_type", "")
    vision = config.get("vision_config") or {}
    image = dict(processor)
    own = processor.get("processor") or {}
    image.update(own.get("image_processor") or {})
    if model_type in QWEN_PATCH:
        return _qwen_rules(model_type, vision, image)
    if model_type == "gemma3":
        return _gemma3_rules(vision, image, own)
    if model_type == "paligemma":
        return _paligemma_rules(vision, image)
    if model_type == "llava":
        return _llava_rules(vision, image, own)
    if model_type in ("idefics3", "smolvlm"):
        return _tile_rules(model_type, config, vision, image, own)
    raise BadInput(f"image tokens of {model_type or 'this model'!r} are not counted yet (known: {', '.join(KNOWN)})")


KNOWN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "paligemma", "llava", "idefics3", "smolvlm")


def _qwen_rules(model_type: str, vision: dict, image: dict) -> QwenRules:
    # mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py: _qwen_vl_image_kwargs
    size = image.get("size") or {}
    min_pixels = image.get("min_pixels") or size.get("shortest_edge") or QWEN_MIN_PIXELS
    max_pixels = image.get("max_pixels") or size.get("longest_edge") or QWEN_MAX_PIXELS
    return QwenRules(
        patch_size=int(image.get("patch_size") or QWEN_PATCH[model_type]),
        merge_size=int(image.get("merge_size") or vision.get("spatial_merge_size") or 2),
        min_pixels=int(min_pixels),
        max_pixels=int(max_pixels),
        family=model_type,
    )


def _gemma3_rules(vision: dict, image: dict, own: dict) -> FixedRules:
    # mlx_vlm/models/gemma3/processing_gemma3.py: image_seq_length from
    # processor_config.json (default 256); pan-and-scan only when asked for.
    if image.get("do_pan_and_scan"):
        raise BadInput("Gemma 3's pan-and-scan (do_pan_and_scan) is not counted: it crops each image into a varying number of views")
    size = image.get("size") or {}
    side = int(vision.get("image_size") or 896)
    shape = (int(size.get("height", side)), int(size.get("width", side)))
    return FixedRules(int(own.get("image_seq_length", 256)), shape, int(vision.get("patch_size", 14)), "gemma3")


def _paligemma_rules(vision: dict, image: dict) -> FixedRules:
    # mlx_vlm/models/paligemma/processing_paligemma.py: image_seq_length is the
    # image processor's (preprocessor_config.json), (image_size / patch)² in config.json
    patch = int(vision.get("patch_size", 14))
    size = image.get("size") or {}
    side = int(vision.get("image_size") or 224)
    shape = (int(size.get("height", side)), int(size.get("width", side)))
    tokens = image.get("image_seq_length") or vision.get("num_image_tokens") or (shape[0] // patch) * (shape[1] // patch)
    return FixedRules(int(tokens), shape, patch, "paligemma")


def _llava_rules(vision: dict, image: dict, own: dict) -> FixedRules:
    # mlx_vlm/models/llava/processing_llava.py: (h // patch) * (w // patch)
    # + num_additional_image_tokens, - 1 with the "default" feature strategy, over
    # the CLIP image processor's output (its center crop)
    patch = int(own.get("patch_size") or vision.get("patch_size") or 14)
    crop = image.get("crop_size") or {}
    size = image.get("size") or {}
    if image.get("do_center_crop", True) and crop:
        shape = (int(crop["height"]), int(crop["width"])) if isinstance(crop, dict) else (int(crop), int(crop))
    elif "height" in size:
        shape = (int(size["height"]), int(size["width"]))
    else:
        side = int(vision.get("image_size") or 336)
        shape = (side, side)
    tokens = (shape[0] // patch) * (shape[1] // patch) + int(own.get("num_additional_image_tokens", 0))
    if own.get("vision_feature_select_strategy") == "default":
        tokens -= 1
    return FixedRules(tokens, shape, patch, "llava")


def _tile_rules(model_type: str, config: dict, vision: dict, image: dict, own: dict) -> TileRules:
    # transformers' Idefics3/SmolVLM image processors: size {"longest_edge": 4 * 364},
    # max_image_size {"longest_edge": 364}, do_image_splitting True by default;
    # the processors' image_seq_len defaults to 169 (processor_config.json says)
    patch = int(vision.get("patch_size", 14))
    tile = int((image.get("max_image_size") or {}).get("longest_edge", 364))
    seq_len = own.get("image_seq_len")
    if seq_len is None:
        scale = int(config.get("scale_factor", 2))
        seq_len = (tile // patch) ** 2 // scale**2
    return TileRules(
        longest_edge=int((image.get("size") or {}).get("longest_edge", 4 * 364)),
        tile=tile,
        image_seq_len=int(seq_len),
        patch_size=patch,
        splitting=bool(image.get("do_image_splitting", True)),
        family=model_type,
    )


def shipped_image_facts() -> dict[str, dict]:
    """Lower-cased Hugging Face id -> the shipped entry of data/image_processors.json."""
    import json

    from .. import data_text

    return {m["id"].lower(): m for m in json.loads(data_text("image_processors.json"))["models"]}


def shipped_image_rules(model_id: str) -> Rules | None:
    """The image rule of a VLM whose processor facts mlxfit ships, offline; None if not shipped."""
    entry = shipped_image_facts().get(model_id.lower())
    if entry is None:
        return None
    return image_rules(entry["config"], {**entry["preprocessor"], "processor": entry.get("processor", {})})


def parse_image_size(text: str) -> tuple[int, int]:
    """"896x672" -> (896, 672): width by height, in pixels."""
    match = re.fullmatch(r"\s*(\d+)\s*[x×X]\s*(\d+)\s*", text or "")
    if not match:
        raise BadInput(f"--image-size {text!r}: give width x height in pixels, like 896x672")
    width, height = int(match.group(1)), int(match.group(2))
    if not (0 < width <= 16384 and 0 < height <= 16384):
        raise BadInput(f"--image-size {text!r}: each side must be 1 to 16384 pixels")
    if max(width, height) / min(width, height) > 200:
        raise BadInput(f"--image-size {text!r}: the processors refuse an aspect ratio over 200")
    return width, height


@dataclass(frozen=True)
class StandInImages:
    """`--image-size` and `--images-per-example` standing in for `--data`."""

    size: tuple[int, int]  # (width, height)
    size_is_default: bool
    images: int
    grid: ImageGrid

    @property
    def tokens(self) -> int:
        return self.grid.tokens * self.images


def stand_in_images(rules: Rules, size: tuple[int, int] | None = None, images: int = 1) -> StandInImages:
    """The image tokens of one example of `images` images of `size` (width, height),
    or the family's default size: the processor's own for fixed-size families, a
    1024×768 photo for the others (PHOTO_SIZE)."""
    if images < 0:
        raise BadInput(f"--images-per-example {images}: give 0 or more")
    chosen = size or rules.default_size
    return StandInImages(chosen, size is None, images, rules.grid(*chosen))


QWEN_TEMPORAL_PATCH = 2  # mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py: temporal_patch_size


def pixel_values_shape(rules: Rules, grids: list[ImageGrid]) -> tuple:
    """The shape of one example's pixel_values as the family's processor returns them
    (benchmarks/results/vision_measured.json holds mlx-vlm's own): Qwen-VL flattens every
    image's patches into (patches, 3 x temporal x patch x patch); tiling families stack
    (1, views, 3, tile, tile); fixed-size ones (images, 3, height, width)."""
    if not grids:
        return ()
    if isinstance(rules, QwenRules):
        return (sum(g.patches for g in grids), 3 * QWEN_TEMPORAL_PATCH * rules.patch_size**2)
    h, w = grids[0].pixel_shape
    if isinstance(rules, TileRules):
        return (1, sum(g.views for g in grids), 3, h, w)
    return (len(grids), 3, h, w)


def _positive(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise BadInput(f"an image of {width}x{height} pixels has no area")


def _smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    # mlx_vlm/models/qwen3_vl/processing_qwen3_vl.py: _smart_resize_image
    _positive(width, height)
    if max(height, width) / min(height, width) > 200:
        raise BadInput(f"an image of {width}x{height} pixels: the processor refuses an aspect ratio over 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _rescale_to_max_len(height: int, width: int, max_len: int) -> tuple[int, int]:
    # transformers' idefics3 image processor: _resize_output_size_rescale_to_max_len
    aspect_ratio = width / height
    if width >= height:
        width = max_len
        height = int(width / aspect_ratio)
        if height % 2 != 0:
            height += 1
    else:
        height = max_len
        width = int(height * aspect_ratio)
        if width % 2 != 0:
            width += 1
    return max(height, 1), max(width, 1)


def _scale_below_upper_bound(height: int, width: int, max_len: int) -> tuple[int, int]:
    # transformers' idefics3 image processor: _resize_output_size_scale_below_upper_bound
    aspect_ratio = width / height
    if width >= height and width > max_len:
        width = max_len
        height = int(width / aspect_ratio)
    elif height > width and height > max_len:
        height = max_len
        width = int(height * aspect_ratio)
    return max(height, 1), max(width, 1)


def _tile_multiples(height: int, width: int, tile: int) -> tuple[int, int]:
    # transformers' idefics3 image processor: resize_for_vision_encoder
    aspect_ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = int(width / aspect_ratio)
        height = math.ceil(height / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = int(height * aspect_ratio)
        width = math.ceil(width / tile) * tile
    return height, width
