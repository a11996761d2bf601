"""Build the model mlx-lm would train, ready for training. Imports mlx_lm: only the
measuring child process (and tests) use this module.

Mirrors mlx_lm/lora.py `train_model` up to the trainer call: freeze, then unfreeze
the last `num_layers` blocks (full) or convert them to LoRA/DoRA layers.
"""

from __future__ import annotations

import glob
import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import MlxfitError
from ..model.lazy_model import checkpoint_dtype
from ..model.training import TrainingConfig

# Random weights repeat a random block of this many values: memory does not
# depend on the values, and a full-size random draw costs several times more
# time and memory than the weights themselves.
_FILL_PERIOD = 1 << 20


def has_weights(folder: Path | None) -> bool:
    return folder is not None and folder.is_dir() and bool(glob.glob(str(folder / "model*.safetensors")))


def _random_values(shape, dtype, scale):
    if mx.issubdtype(dtype, mx.integer):  # packed quantized weights: any bits will do
        return mx.random.randint(0, 1 << min(31, 8 * dtype.size - 1), shape, dtype=dtype)
    return mx.random.uniform(-scale, scale, shape, dtype=dtype)


def _random_fill(shape, dtype, scale=0.02):
    """Random rows, repeated: a block of whole rows that divides the row count, so
    the result is one exact-size array (a sliced-off tail would keep its buffer)."""
    n = math.prod(shape)
    if n <= _FILL_PERIOD:
        return _random_values(shape, dtype, scale)
    cols = shape[-1]
    rows = n // cols
    block = max(1, min(rows, _FILL_PERIOD // cols))
    while rows % block:
        block -= 1
    tile = _random_values((1, block, cols), dtype, scale)
    return mx.broadcast_to(tile, (rows // block, block, cols)).reshape(shape)


def _drop_untrained_head(model: nn.Module) -> None:
    """Gemma 3 checkpoints have no lm_head: gemma3_text's sanitize() drops it on load."""
    inner = getattr(model, "language_model", model)
    if type(inner).__module__.endswith("gemma3_text") and "lm_head" in inner:
        inner.sanitize({})


def random_model(config: dict, dtype: mx.Dtype | None = None) -> nn.Module:
    """The architecture with random weights in the model's dtype; left lazy."""
    from mlx_lm.utils import _get_classes

    try:
        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(config))
    except (ValueError, TypeError, KeyError) as e:
        raise MlxfitError(f"mlx-lm cannot build {config.get('model_type')!r} from this config: {e}") from e
    _drop_untrained_head(model)
    dtype = dtype or checkpoint_dtype(config)
    weights = [
        (name, _random_fill(p.shape, dtype) if p.ndim >= 2 else p.astype(dtype))
        for name, p in tree_flatten(model.parameters())
    ]
    model.update(tree_unflatten(weights))
    if config.get("quantization"):
        _quantize_as_loaded(model, config)
    return model


def converted_layers(model: nn.Module, config: dict):
    """The `class_predicate` of the layers a converted checkpoint holds quantized.

    mlx_lm/utils.py load_model quantizes a layer when the config names it (its own
    settings, or False) or when the checkpoint has its `scales`; `mlx_lm.convert -q`
    (quantize_model's wrapped_predicate) wrote scales for every layer with
    `to_quantized` whose input width divides by the group size and that the
    model's own `quant_predicate` accepts.
    """
    quantization = config["quantization"]
    own = getattr(model, "quant_predicate", None)

    def predicate(path, module):
        if path in quantization:
            return quantization[path]
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % quantization["group_size"]:
            return False
        return own(path, module) if own is not None else True

    return predicate


def _quantize_as_loaded(model: nn.Module, config: dict) -> None:
    """A config with a `quantization` block and no weights: the layers load_model
    would quantize, with random packed weights, scales and biases."""
    q = config["quantization"]
    nn.quantize(model, q["group_size"], q["bits"], mode=q.get("mode", "affine"), class_predicate=converted_layers(model, config))
    _randomize_quantized(model)


def _randomize_quantized(model: nn.Module) -> None:
    """Replace the quantized layers' lazy mx.quantize of random float weights by
    random arrays of the same shapes and dtypes: the float weights are then never
    computed, and the model holds what a loaded checkpoint holds, no more."""
    for _, module in model.named_modules():
        if "scales" not in module:
            continue
        for key, value in list(module.items()):
            if isinstance(value, mx.array):
                setattr(module, key, _random_fill(value.shape, value.dtype))


def load_weights_model(folder: Path) -> nn.Module:
    from mlx_lm.utils import load_model

    model, _ = load_model(folder, lazy=True)
    return model


def quantize(model: nn.Module, config: dict, training: TrainingConfig, random: bool = False) -> nn.Module:
    """As `mlx_lm.convert -q` does (mlx_lm/utils.py: quantize_model). With `random`,
    the quantized arrays are drawn directly, as a converted checkpoint would load."""
    from mlx_lm.utils import quantize_model

    model, _ = quantize_model(model, config, group_size=training.group_size, bits=training.bits)
    if random:
        _randomize_quantized(model)
    return model


def keep_last_blocks(model: nn.Module, blocks: int) -> None:
    """A slice (mlxfit/measure/slicing.py): the model's block list cut to its last `blocks`,
    before anything is evaluated, so the others never take memory."""
    from ..model.module_tree import modules

    layers = model.layers
    for _, module in modules(model):
        for key, value in module.items():
            # The list itself, or the one `layers` is a view of (mlx_lm/models/pipeline.py
            # PipelineMixin: pipeline_layers = layers[start_idx:end_idx]).
            if isinstance(value, list) and layers and (value is layers or any(v is layers[-1] for v in value)):
                module[key] = value[len(value) - blocks:]
                if getattr(module, "end_idx", None) is not None:
                    module.start_idx, module.end_idx = 0, blocks
                return
    raise MlxfitError(f"{type(model).__module__.split('.')[-1]}'s blocks cannot be sliced: measure the whole run")


def materialize(model: nn.Module) -> None:
    """Evaluate one parameter at a time, so lazy sources never pile up."""
    for _, p in tree_flatten(model.parameters()):
        mx.eval(p)


def prepare_for_training(model: nn.Module, training: TrainingConfig) -> None:
    """mlx_lm/lora.py train_model: freeze, then unfreeze or convert the last blocks."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model.freeze()
    num_layers = training.num_layers
    if num_layers > len(model.layers):
        raise MlxfitError(
            f"Requested to train {num_layers} layers but the model only has {len(model.layers)} layers"
        )
    if training.fine_tune_type == "full":
        for layer in model.layers[-max(num_layers, 0):]:
            layer.unfreeze()
    else:
        try:
            lora = {"rank": training.rank, "scale": training.scale, "dropout": training.dropout}
            if training.lora_keys is not None:
                lora["keys"] = list(training.lora_keys)
            linear_to_lora_layers(model, num_layers, lora, use_dora=(training.fine_tune_type == "dora"))
        except ValueError as e:
            raise MlxfitError(str(e)) from e


def build(config: dict, folder: Path | None, training: TrainingConfig, on_stage=lambda stage: None,
          blocks: int | None = None) -> nn.Module:
    """Load (real weights) or build (random weights), quantize for QLoRA, prepare.
    `blocks`: keep only the last blocks (a slice of the model)."""
    loaded = has_weights(folder)
    if loaded:
        on_stage("loading weights")
        model = load_weights_model(folder)
    else:
        on_stage("building random weights")
        model = random_model(config)  # quantized as loaded if the config says so
    if blocks is not None:
        keep_last_blocks(model, blocks)
    already_quantized = bool(config.get("quantization"))
    if training.quantize and not already_quantized:
        on_stage("quantizing")
        model = quantize(model, config, training, random=not loaded)
    materialize(model)
    on_stage("preparing adapters" if training.fine_tune_type != "full" else "unfreezing layers")
    prepare_for_training(model, training)
    materialize(model)
    return model
