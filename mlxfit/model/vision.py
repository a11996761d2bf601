"""A vision-language model as mlx-vlm trains it, built lazily from config.json.

A config with a `vision_config` whose model_type mlx-vlm knows (mlx_vlm/utils.py
get_model_type, with its MODEL_REMAPPING) is built the way mlx_vlm/utils.py
load_model builds it (ModelConfig.from_dict, update_module_configs, Model), without
evaluating anything: MLX arrays cost nothing until evaluated, as for mlx-lm's models
(mlxfit/model/lazy_model.py). From that model this module reads:

- the parameters of the language model, the vision tower and the projector (every
  other top-level module), by mlx-vlm's own top-level names;
- the linears mlx-vlm puts LoRA on (mlx_vlm/trainer/peft/utils.py
  _resolve_lora_targets with find_all_linear_names: the language model's linears
  but its head), called on the built model itself;
- the vision tower's blocks (the `layers` / `blocks` list that
  enable_model_gradient_checkpointing checkpoints): width, heads, linears.

The language model is also sized as mlx-lm's (mlxfit/estimate/detailed.py) where
mlx-lm has a model for it: the whole config (qwen2_vl, gemma3, ...) or its
text_config with its own model_type (paligemma's gemma, idefics3's llama).

`VisionTraining` holds mlx_vlm.train's flags with their defaults
(tests/test_vision.py pins each against mlx_vlm.train.build_parser).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field

from ..errors import BadInput, MlxfitError

EXTRA = ("vision-language models are sized with mlx-vlm's own model classes and trainer: "
         "install the vlm extra (pip install 'mlxfit[vlm]')")
# mlx_vlm/trainer/peft/utils.py freeze_model / mlx_vlm/train.py _configure_model:
# the vision side's top-level names (the projector is every other non-language one).
VISION_TOWERS = ("vision_tower", "vision_model", "visual")
LANGUAGE = "language_model"
# Families whose processor returns a pixel_attention_mask (int64, one per pixel of each
# tile) beside pixel_values: Idefics3ImageProcessor (mlx_vlm/models/idefics3); the
# benchmark reads it from the processed rows.
PIXEL_MASK_FAMILIES = ("idefics2", "idefics3", "smolvlm")


def has_vision(config: dict) -> bool:
    """A config with a vision part: what mlx-vlm, not mlx-lm, trains."""
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def require_mlx_vlm() -> None:
    if importlib.util.find_spec("mlx_vlm") is None:
        raise MlxfitError(EXTRA)


@dataclass(frozen=True)
class VisionTraining:
    """mlx_vlm.train's flags that change a step's memory, with its defaults."""

    train_type: str = "lora"  # --train-type: lora, dora, full
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    batch_size: int = 1
    max_seq_length: int = 2048
    pad_to_multiple: int = 32
    grad_checkpoint: bool = False
    train_vision: bool = False
    optimizer: str = "adamw"
    cache_size: int | None = 32
    compile: bool = False
    gradient_accumulation_steps: int = 1

    def __post_init__(self):
        if self.train_type not in ("lora", "dora", "full"):
            raise BadInput(f"unknown --train-type {self.train_type!r} (use lora, dora or full)")
        if self.optimizer not in ("adam", "adamw", "sgd", "muon"):
            raise BadInput(f"unknown --optimizer {self.optimizer!r} (use adam, adamw, sgd or muon)")
        for name in ("batch_size", "lora_rank", "pad_to_multiple", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise BadInput(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.lora_dropout < 1:
            # mlx_vlm prepare_model_for_training: "LoRA dropout must be in [0, 1)."
            raise BadInput(f"--lora-dropout must be at least 0 and below 1, got {self.lora_dropout}")
        if self.max_seq_length < 2:
            raise BadInput(f"--max-seq-length must be at least 2, got {self.max_seq_length}")

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


@dataclass(frozen=True)
class VisionTower:
    blocks: int
    width: int  # the blocks' hidden width
    heads: int
    block_outputs: int  # the outputs of one block's linears, per patch
    block_params: int
    full_attention_blocks: int = 0  # blocks attending over a whole image (Qwen2.5-VL: fullatt_block_indexes; else all)


@dataclass(frozen=True)
class VisionModelInfo:
    model_type: str  # mlx-vlm's
    config: dict = field(repr=False)
    dtype_bytes: int
    language_bytes: int
    vision_bytes: int
    projector_bytes: int
    language_params: int
    vision_params: int
    projector_params: int
    lora_targets: tuple  # ((path, in_features, out_features), ...) mlx-vlm wraps
    tower: VisionTower
    language: object = field(default=None, repr=False)  # mlx-lm's ModelInfo of the language model, or None
    tied_head: bool = False  # the language model's logits come from its embed_tokens (no lm_head module)
    vocab_size: int = 0
    dtype: str = "bfloat16"  # the checkpoint's, as config.json names it (mlx-vlm loads the weights in it)

    @property
    def weight_bytes(self) -> int:
        return self.language_bytes + self.vision_bytes + self.projector_bytes

    @property
    def params(self) -> int:
        return self.language_params + self.vision_params + self.projector_params


def build(config: dict):
    """mlx-vlm's model of this config as load_model makes it, nothing evaluated."""
    require_mlx_vlm()
    import copy

    from mlx_vlm.utils import get_model_and_args, update_module_configs

    from . import module_tree
    from .lazy_model import checkpoint_dtype

    config = copy.deepcopy(config)
    try:
        model_class, model_type = get_model_and_args(config=config)
    except (ValueError, KeyError) as e:
        raise MlxfitError(f"mlx-vlm has no model for model_type {config.get('model_type')!r}") from e
    config.setdefault("text_config", config.pop("llm_config", {}))
    config.setdefault("vision_config", {})
    config.setdefault("audio_config", {})
    try:
        model_config = model_class.ModelConfig.from_dict(config)
        model_config = update_module_configs(model_config, model_class, config,
                                             ["text", "vision", "perceiver", "projector", "audio"])
        model = model_class.Model(model_config)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError, IndexError) as e:
        raise MlxfitError(f"mlx-vlm cannot build {model_type!r} from this config.json: {type(e).__name__}: {e}") from e
    module_tree.set_dtype(model, checkpoint_dtype(config))
    return model, model_type


def _tower(model) -> VisionTower:
    import mlx.nn as nn

    from . import module_tree

    tower = next((model[name] for name in VISION_TOWERS if name in model), None)
    if tower is None:
        return VisionTower(0, 0, 0, 0, 0)
    stack = None
    for _, module in module_tree.modules(tower):
        for name in ("layers", "blocks"):
            found = getattr(module, name, None)
            if isinstance(found, (list, tuple)) and found and isinstance(found[0], nn.Module):
                stack = found
                break
        if stack is not None:
            break
    if stack is None:
        return VisionTower(0, 0, 0, 0, 0)
    block = stack[0]
    linears = [m for _, m in module_tree.modules(block) if isinstance(m, (nn.Linear, nn.QuantizedLinear))]
    heads = next((int(getattr(m, a)) for _, m in module_tree.modules(block)
                  for a in ("num_heads", "n_heads", "num_attention_heads") if isinstance(getattr(m, a, None), int)), 1)
    width = linears[0].weight.shape[1] if linears else 0
    full = model_config_full_blocks(model, len(stack))
    return VisionTower(blocks=len(stack), width=width, heads=heads,
                       block_outputs=sum(m.weight.shape[0] for m in linears), block_params=module_tree.size(block),
                       full_attention_blocks=full)


def model_config_full_blocks(model, blocks: int) -> int:
    """Qwen2.5-VL's vision blocks attend within windows but for fullatt_block_indexes
    (mlx_vlm/models/qwen2_5_vl/vision.py); every other tower's attend over whole images."""
    vision = getattr(getattr(model, "config", None), "vision_config", None)
    indexes = getattr(vision, "fullatt_block_indexes", None)
    return len([i for i in indexes if i < blocks]) if isinstance(indexes, (list, tuple)) else blocks


def lora_targets(model) -> tuple:
    """(path, in, out) of every linear mlx-vlm's get_peft_model wraps by default."""
    from mlx_vlm.trainer.peft.utils import _resolve_lora_targets
    from mlx_vlm.trainer.common.utils import get_module_by_name

    out = []
    for path in _resolve_lora_targets(model, None):
        w = get_module_by_name(model, path).weight
        bits = getattr(get_module_by_name(model, path), "bits", None)
        out.append((path, w.shape[1] * (32 // bits if bits else 1), w.shape[0]))
    return tuple(out)


def _language_info(model_id: str, config: dict):
    """mlx-lm's sizing of the language model (ModelInfo), or None where mlx-lm has none."""
    from .lazy_model import text_config
    from .resolve import _from_config

    for candidate in (config, {**text_config(config), "torch_dtype": config.get("torch_dtype")}):
        if not candidate.get("model_type"):
            continue
        try:
            info = _from_config(model_id, "local", candidate)
        except MlxfitError:
            continue
        if info.architecture is not None:
            return info
    return None


def vision_model(config: dict, model_id: str = "model") -> VisionModelInfo:
    """The shape of a VLM's training from its config.json (mlx-vlm needed)."""
    from . import module_tree

    if not has_vision(config):
        raise MlxfitError("config.json has no vision_config: not a vision-language model")
    model, model_type = build(config)
    parts = {"language": 0, "vision": 0, "projector": 0}
    counts = dict(parts)
    for name, child in model.items():
        kind = "language" if name == LANGUAGE else "vision" if name in VISION_TOWERS else "projector"
        parts[kind] += module_tree.nbytes(child)
        counts[kind] += module_tree.size(child)
    arrays = module_tree.arrays(model)
    s = max((a.dtype.size for _, a in arrays if a.dtype.size in (2, 4)), default=2)
    return VisionModelInfo(
        model_type=model_type, config=config, dtype_bytes=s,
        language_bytes=parts["language"], vision_bytes=parts["vision"], projector_bytes=parts["projector"],
        language_params=counts["language"], vision_params=counts["vision"], projector_params=counts["projector"],
        lora_targets=lora_targets(model), tower=_tower(model), language=_language_info(model_id, config),
        tied_head=_tied_head(model), vocab_size=_vocab_size(config), dtype=_dtype_name(config),
    )


def _dtype_name(config: dict) -> str:
    from .lazy_model import DTYPES, checkpoint_dtype

    dtype = checkpoint_dtype(config)
    return next(name for name, d in DTYPES.items() if d == dtype)


def _tied_head(model) -> bool:
    """No lm_head module in the language model: its logits are embed_tokens.as_linear
    (mlx_vlm/models/paligemma/language.py always; others where tie_word_embeddings)."""
    from . import module_tree

    language = model[LANGUAGE] if LANGUAGE in model else None
    if language is None:
        return False
    return not any(path.split(".")[-1] == "lm_head" for path, _ in module_tree.modules(language))


def _vocab_size(config: dict) -> int:
    text = config.get("text_config") or {}
    return int(text.get("vocab_size") or config.get("vocab_size") or 0)


def adapter_elements(info: VisionModelInfo, rank: int) -> int:
    """mlx-vlm's LoRALinear: lora_a (in x r) and lora_b (r x out), float32."""
    return sum(rank * (i + o) for _, i, o in info.lora_targets)


def padded_width(tokens: int, training: VisionTraining) -> int:
    """mlx_vlm/trainer/vlm/sft/runtime.py collate_vlm_batch: the longest row rounded up to
    pad_to_multiple, at most max_seq_length (and at least 2)."""
    longest = min(tokens, training.max_seq_length)
    m = training.pad_to_multiple
    return min(max(2, math.ceil(longest / m) * m), training.max_seq_length)


def with_language_blocks(config: dict, blocks: int) -> dict:
    """config.json with its language model cut to its first `blocks` blocks (a slice
    measured by mlxfit/measure/vision.py): num_hidden_layers where the language model
    reads it (its text_config, or the config itself) and the per-block lists cut with it."""
    import copy

    from .lazy_model import text_config

    config = copy.deepcopy(config)
    for c in {id(c): c for c in (config, text_config(config))}.values():
        if "num_hidden_layers" in c or c is text_config(config):
            c["num_hidden_layers"] = blocks
        if isinstance(c.get("layer_types"), list):
            c["layer_types"] = c["layer_types"][:blocks]
    return config
