"""The model mlx-lm would train, built lazily from config.json.

MLX arrays cost nothing until evaluated, so building mlx-lm's own Model class
from a config (Llama-3.1-8B: tens of milliseconds, no memory) gives every
shape and dtype of the real thing. On that model this module does what mlx-lm
does on load and before training, without evaluating anything:

- mlx_lm/utils.py load_model: the model class (with MODEL_REMAPPING), the
  weights `sanitize` keeps (a tied checkpoint has no lm_head), the
  checkpoint's dtype, and a config's `quantization` block;
- mlx_lm/utils.py quantize_model (`mlx_lm.convert -q`) for QLoRA;
- mlx_lm/tuner/utils.py linear_to_lora_layers and mlx_lm/lora.py's
  freeze/unfreeze for full fine-tuning.

The two functions of mlx-lm that cannot be imported without transformers
(the quantization walk and the LoRA key selection) are copied here;
tests/test_model_architecture.py pins each copy against the real function.

Sizing a plan asks one built model a few hundred questions (its remedies), so
what is walked or converted is kept on the model (`_kept`): each block is
walked once, each kind of layer converted to LoRA or quantized once, and QLoRA's
quantized base is a copy of the built model, not a second build. nn.quantize's
walk is redone without mlx.nn's generic tree machinery;
tests/test_model_architecture.py pins it against Module.leaf_modules and every count
against the model mlx-lm loads.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..errors import MlxfitError
from . import module_tree
from .mlx_lm_modules import import_module, model_classes, module_name

DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
QUANT_MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}
# Config fields that are sizes: a positive integer where present.
POSITIVE_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "vocab_size", "head_dim", "moe_intermediate_size",
    "max_position_embeddings", "n_layer", "n_embd", "n_head", "d_model", "num_layers", "n_heads",
)
# Sizes a real config may give per layer, as a list (gemma3n's intermediate_size).
PER_LAYER_FIELDS = ("intermediate_size", "moe_intermediate_size")
# Counts that may be 0 (a dense model of a MoE family).
# Sizes every model has: null is no size (other fields may be null for "as the default").
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok")


def text_config(config: dict) -> dict:
    """The language model's own config: multimodal configs nest it in `text_config`."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def checkpoint_dtype(config: dict) -> mx.Dtype:
    for c in (config, text_config(config)):
        name = c.get("torch_dtype") or c.get("dtype")
        if name in DTYPES:
            return DTYPES[name]
    return mx.bfloat16


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_config(config: dict) -> None:
    """Values no real model has: one line naming the field (MlxfitError)."""
    if not isinstance(config, dict):
        raise MlxfitError("config.json is not a JSON object")
    if not config.get("model_type"):
        raise MlxfitError("config.json has no 'model_type'")
    if not isinstance(config["model_type"], str):
        raise MlxfitError(f"config.json field 'model_type' must be a string, got {config['model_type']!r}")
    for where, c in (("", config), ("text_config.", text_config(config))):
        for name in POSITIVE_FIELDS + COUNT_FIELDS:
            value = c.get(name)
            if value is None:
                if name in c and name in REQUIRED_FIELDS:
                    raise MlxfitError(f"config.json field '{where}{name}' is null: it must be a positive integer")
                continue
            if isinstance(value, list) and name in PER_LAYER_FIELDS and value:
                bad = next((v for v in value if not _number(v) or v != int(v) or v < 0), None)
                if bad is not None:
                    raise MlxfitError(f"config.json field '{where}{name}' must be integers, one per layer, got {bad!r}")
                continue  # a per-layer list, as the model class reads it (gemma3n)
            if not _number(value) or value != int(value):
                raise MlxfitError(f"config.json field '{where}{name}' must be an integer, got {value!r}")
            if value < 1 and name in POSITIVE_FIELDS or value < 0:
                raise MlxfitError(f"config.json field '{where}{name}' must be positive, got {value!r}")
        heads, kv = c.get("num_attention_heads"), c.get("num_key_value_heads")
        if heads and kv and heads % kv:
            raise MlxfitError(
                f"config.json: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv})"
            )
        hidden = c.get("hidden_size")
        if heads and hidden and not c.get("head_dim") and hidden % heads:
            raise MlxfitError(
                f"config.json: hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}) "
                "and there is no head_dim"
            )


def _construct(config: dict) -> nn.Module:
    check_config(config)
    try:
        model_class, args_class = model_classes(config)
    except ImportError as e:
        if getattr(e, "needs", None):
            raise NotSizable(f"mlx-lm's {config['model_type']!r} model cannot be imported here ({e.needs!r})") from e
        raise UnknownModelType(config["model_type"]) from e
    try:
        return model_class(args_class.from_dict(config))
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError, IndexError) as e:
        raise MlxfitError(f"mlx-lm cannot build {config['model_type']!r} from this config.json: {_first_line(e)}") from e


class NotSizable(MlxfitError):
    """mlx-lm cannot build or train this model: only the rule of thumb can answer."""


class UnknownModelType(NotSizable):
    def __init__(self, model_type: str):
        super().__init__(f"the installed mlx-lm has no model for model_type {model_type!r}")
        self.model_type = model_type


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _tied(config: dict) -> bool:
    # transformers' PretrainedConfig: tie_word_embeddings defaults to True.
    return bool(text_config(config).get("tie_word_embeddings", config.get("tie_word_embeddings", True)))


def _sanitize(model: nn.Module, config: dict) -> None:
    """What load_model's `model.sanitize(weights)` does to the model itself: a
    checkpoint of tied embeddings has no lm_head, and some families (gemma3)
    then drop theirs."""
    if not hasattr(model, "sanitize"):
        return
    weights = dict(module_tree.arrays(model))
    if _tied(config):
        weights = {k: v for k, v in weights.items() if not k.endswith("lm_head.weight")}
    try:
        model.sanitize(weights)
    except Exception:  # a sanitize written for the checkpoint's own names
        pass


def _quantization(config: dict) -> dict | None:
    """mlx_lm/utils.py load_model: `quantization`, or a legacy quantization_config."""
    quant = config.get("quantization")
    if isinstance(quant, dict):
        return quant
    legacy = config.get("quantization_config") or text_config(config).get("quantization_config")
    if isinstance(legacy, dict):
        method = legacy.get("quant_method")
        if method in ("mxfp4", "mxfp8"):
            return {"group_size": 32, "bits": 4 if method == "mxfp4" else 8, "mode": method}
        if method in ("awq", "gptq"):
            return {"group_size": legacy.get("group_size", 128), "bits": legacy.get("bits", 4)}
    return None


def convert_predicate(model: nn.Module, group_size: int, overrides: dict | None = None):
    """mlx_lm/utils.py quantize_model's wrapped_predicate, plus load_model's
    per-layer entries of a saved `quantization` block (dicts, or False)."""
    quant_predicate = getattr(model, "quant_predicate", None)
    overrides = overrides or {}

    def predicate(path: str, module: nn.Module):
        if path in overrides:
            return overrides[path]
        if not hasattr(module, "to_quantized"):
            return False
        if module.weight.shape[-1] % group_size != 0:
            return False
        return quant_predicate(path, module) if quant_predicate is not None else True

    return predicate


def quantize(model: nn.Module, bits: int, group_size: int, mode: str = "affine", overrides: dict | None = None) -> None:
    """nn.quantize(model, group_size, bits, mode=mode, class_predicate=convert_predicate(...)),
    as mlx_lm.convert -q and load_model call it, without mlx.nn's generic tree
    machinery (module_tree.leaf_modules walks the same layers) and with each
    distinct layer quantized once: MLX's to_quantized makes the first of each kind,
    and layers of the same type, arrays and arguments get a copy of it (the arrays
    are lazy: their values never matter here, their shapes and dtypes are what
    to_quantized made). A model of 28 blocks has 196 linears of 7 kinds."""
    predicate = convert_predicate(model, group_size, overrides)
    try:
        made = {}
        replacements = []
        for path, module in module_tree.leaf_modules(model):
            if not (wanted := predicate(path, module)):
                continue
            kwargs = _quantize_kwargs(module, wanted, group_size, bits, mode)
            kind = _kind_of_layer(module, kwargs)
            if kind is None or kind not in made:
                layer = module.to_quantized(**kwargs)
                if kind is not None:
                    made[kind] = layer
            else:
                layer = _twin(made[kind])
            replacements.append((path, layer))
    except (TypeError, ValueError, AttributeError) as e:
        raise MlxfitError(f"mlx-lm cannot quantize this model ({bits} bits, group {group_size}): {_first_line(e)}") from e
    for path, layer in replacements:
        _replace(model, path, layer)


def _quantize_kwargs(module: nn.Module, wanted, group_size, bits, mode) -> dict:
    """mlx/nn/layers/quantized.py quantize's _maybe_quantize: to_quantized's arguments."""
    if not hasattr(module, "to_quantized"):
        raise ValueError(f"Unable to quantize model of type {type(module)}")
    if isinstance(wanted, bool):
        return {"group_size": group_size, "bits": bits, "mode": mode}
    if isinstance(wanted, dict):
        if "quantize_input" in wanted and not wanted["quantize_input"]:
            wanted.pop("quantize_input")
        return wanted
    raise ValueError("``class_predicate`` must return a bool or a dict of parameters to pass to ``to_quantized``")


def _kind_of_layer(module: nn.Module, kwargs: dict):
    """What to_quantized's result depends on: the layer's type, plain attributes,
    arrays' names, shapes and dtypes, and the arguments (None: not hashable)."""
    attributes = tuple(sorted((k, v) for k, v in vars(module).items()
                              if not k.startswith("_") and isinstance(v, (int, float, str, bool, type(None)))))
    arrays = tuple((k, tuple(a.shape), a.dtype) for k, a in module_tree.walk(module) if isinstance(a, mx.array))
    kind = (type(module), attributes, arrays, tuple(sorted(kwargs.items())))
    try:
        hash(kind)
    except TypeError:
        return None
    return kind


def _twin(layer: nn.Module) -> nn.Module:
    """A copy of a quantized layer: its own module (and frozen set), the same lazy arrays."""
    twin = copy.copy(layer)
    twin._no_grad = set(layer._no_grad)
    return twin


def _replace(model: nn.Module, path: str, layer: nn.Module) -> None:
    """Module.update_modules for one dotted path (lists indexed by number)."""
    *parents, last = path.split(".")
    node = model
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = layer
    else:
        node[last] = layer


def _apply_saved_quantization(model: nn.Module, quant: dict) -> None:
    mode = quant.get("mode", "affine")
    group_size, bits = QUANT_MODE_DEFAULTS.get(mode, (64, 4))
    group_size = int(quant.get("group_size") or group_size)
    bits = int(quant.get("bits") or bits)
    overrides = {k: v for k, v in quant.items() if isinstance(v, (dict, bool))}
    quantize(model, bits, group_size, mode, overrides)


def build(config: dict) -> nn.Module:
    """mlx-lm's model of this config, as load_model leaves it; nothing evaluated."""
    model = _construct(config)
    _sanitize(model, config)
    module_tree.set_dtype(model, checkpoint_dtype(config))
    quant = _quantization(config)
    if quant:
        _apply_saved_quantization(model, quant)
    if not hasattr(model, "layers") or len(model.layers) == 0:
        raise NotSizable(f"mlx-lm's {module_name(config)!r} model has no transformer blocks to train")
    if module_tree.size(model) == 0:
        raise MlxfitError("config.json describes a model with no parameters")
    return model


def config_key(config: dict) -> str:
    """A config as a hashable key (the models built from it are cached by it)."""
    return json.dumps(config, sort_keys=True, default=str)


@lru_cache(maxsize=16)
def built_for_key(key: str) -> nn.Module:
    """The model as load_model leaves it (build), for a config made a key: what its
    architecture is read from, even where mlx-lm cannot train it."""
    return build(json.loads(key))


@lru_cache(maxsize=16)
def model_for_key(key: str, bits: int | None = None, group_size: int | None = None) -> nn.Module:
    """base_model, for a config already made a key (config_key), frozen as training starts."""
    if bits is None:
        model = built_for_key(key)
    else:  # the built model, copied (building it again takes longer), then quantized
        model = _copy_tree(model_for_key(key, None, None))  # as base_model asks for it (one cache entry)
        quantize(model, bits, group_size)
    try:
        # mlx_lm/lora.py train_model freezes the model first (adapted layers are
        # frozen one by one in adapter_parameters; walking every module is slow).
        model.freeze(recurse=False)
    except AttributeError as e:  # a model class that never ran nn.Module.__init__
        raise NotSizable(f"mlx-lm cannot train its {type(model).__module__.split('.')[-1]!r} model: {_first_line(e)}") from e
    return model


def _copy_tree(value):
    """A built model's module tree copied: new modules, dicts, lists and tuples
    holding the same (lazy, never evaluated) arrays. Each module keeps its
    attributes and a copy of its frozen set, not what sizing kept on it."""
    if isinstance(value, nn.Module):
        twin = type(value).__new__(type(value))
        state = {k: v for k, v in vars(value).items() if k != "_mlxfit_kept"}
        if isinstance(state.get("_no_grad"), set):
            state["_no_grad"] = set(state["_no_grad"])
        twin.__dict__.update(state)
        for k, v in value.items():
            dict.__setitem__(twin, k, _copy_tree(v))
        return twin
    if type(value) is dict:
        return {k: _copy_tree(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_copy_tree(v) for v in value)
    return value


def base_model(config: dict, bits: int | None = None, group_size: int | None = None) -> nn.Module:
    """The lazily built model, optionally quantized as `mlx_lm.convert -q
    --q-bits bits --q-group-size group_size` would (QLoRA). Cached: do not mutate."""
    return model_for_key(config_key(config), bits, group_size)


# -- LoRA / DoRA: mlx_lm/tuner/utils.py linear_to_lora_layers ----------------

def _lora_types():
    switch = import_module("models.switch_layers")
    lora, dora = import_module("tuner.lora"), import_module("tuner.dora")
    return switch, lora, dora


def _kept(model: nn.Module) -> dict:
    """What this module found out about a built model, kept on the model itself
    (an attribute starting with "_" is no parameter): sizing a plan asks the same
    model dozens of times, and each answer only needs each block walked once."""
    kept = getattr(model, "_mlxfit_kept", None)
    if kept is None:
        kept = {}
        object.__setattr__(model, "_mlxfit_kept", kept)
    return kept


def _once(model: nn.Module, key, compute):
    kept = _kept(model)
    if key not in kept:
        kept[key] = compute()
    return kept[key]


def block_tree(model: nn.Module, i: int | None) -> list:
    """module_tree.walk of block i (None: the whole model), walked once per model."""
    return _once(model, ("tree", i), lambda: module_tree.walk(model if i is None else model.layers[i]))


def block_modules(model: nn.Module, i: int | None) -> list[tuple[str, nn.Module]]:
    """module_tree.modules of block i (None: the whole model)."""
    return _once(model, ("modules", i), lambda: [(k, m) for k, m in block_tree(model, i) if isinstance(m, nn.Module)])


def block_arrays(model: nn.Module, i: int | None) -> list[tuple[str, mx.array]]:
    """module_tree.arrays of block i (None: the whole model)."""
    return _once(model, ("arrays", i), lambda: [(k, a) for k, a in block_tree(model, i) if isinstance(a, mx.array)])


def nbytes(model: nn.Module) -> int:
    """module_tree.nbytes of the whole model."""
    return _once(model, "nbytes", lambda: sum(a.nbytes for _, a in block_arrays(model, None)))


def block_nbytes(model: nn.Module, i: int) -> int:
    return _once(model, ("nbytes", i), lambda: sum(a.nbytes for _, a in block_arrays(model, i)))


def default_lora_keys(model: nn.Module) -> set[str]:
    """Every Linear / SwitchLinear / Embedding (or module with to_lora) of any block,
    found once per model."""
    return _once(model, "lora_keys", lambda: _default_lora_keys(model))


def _default_lora_keys(model: nn.Module) -> set[str]:
    switch, _, _ = _lora_types()
    types = (nn.Linear, nn.QuantizedLinear, switch.SwitchLinear, switch.QuantizedSwitchLinear, nn.Embedding, nn.QuantizedEmbedding)
    return {path for i in range(len(model.layers)) for path, module in block_modules(model, i)
            if path and (hasattr(module, "to_lora") or isinstance(module, types))}


def to_lora(module: nn.Module, rank: int, scale: float, dropout: float, dora: bool) -> nn.Module:
    switch, lora, dora_mod = _lora_types()
    if not dora and hasattr(module, "to_lora"):
        return module.to_lora(r=rank, scale=scale, dropout=dropout)
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        layer = dora_mod.DoRALinear if dora else lora.LoRALinear
    elif isinstance(module, (switch.SwitchLinear, switch.QuantizedSwitchLinear)):
        if dora:
            raise MlxfitError(f"{type(module).__name__} doesn't support DoRA yet (mlx-lm refuses DoRA on MoE experts)")
        layer = lora.LoRASwitchLinear
    elif isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        layer = dora_mod.DoRAEmbedding if dora else lora.LoRAEmbedding
    else:
        raise MlxfitError(f"Can't convert layer of type {type(module).__name__} to LoRA")
    return layer.from_base(module, r=rank, scale=scale, dropout=dropout)


def _last_blocks(model: nn.Module, num_layers: int) -> range:
    layers = len(model.layers)
    n = layers if num_layers < 0 else num_layers
    return range(layers - n, layers)


def adapter_parameters(model: nn.Module, num_layers: int, rank: int, dora: bool, keys=None,
                       scale: float = 20.0, dropout: float = 0.0) -> list[tuple[str, mx.array]]:
    """The trainable arrays linear_to_lora_layers adds (float32 lora_a/lora_b,
    DoRA's magnitude), built on the frozen base without changing the model."""
    keys = frozenset(default_lora_keys(model) if keys is None else keys)
    return [param for i in (*_last_blocks(model, num_layers), None)
            for param in _block_adapters(model, i, rank, dora, keys, scale, dropout)]


def _block_adapters(model: nn.Module, i: int | None, rank: int, dora: bool, keys: frozenset, scale: float,
                    dropout: float) -> list[tuple[str, mx.array]]:
    """adapter_parameters of block i (None: the top-level modules), once per model."""
    return _once(model, ("adapters", i, rank, dora, keys, scale, dropout),
                 lambda: _convert(model, i, rank, dora, keys, scale, dropout))


def _convert(model: nn.Module, i: int | None, rank: int, dora: bool, keys: frozenset, scale: float,
             dropout: float) -> list[tuple[str, mx.array]]:
    # Layers of one type and shape get adapters of one shape: convert one of each.
    seen = _once(model, ("converted", rank, dora, scale, dropout), dict)
    params = []
    for path, module in block_modules(model, i):
        if path not in keys:
            continue
        prefix = f"layers.{i}.{path}" if i is not None else path
        signature = (type(module), tuple(module["weight"].shape) if "weight" in module else None,
                     getattr(module, "bits", None), getattr(module, "group_size", None))
        if signature not in seen:
            module.freeze()  # as mlx_lm/lora.py's model.freeze() left it
            try:
                wrapped = to_lora(module, rank, scale, dropout, dora)
            except (TypeError, ValueError, AttributeError) as e:
                raise MlxfitError(f"mlx-lm cannot put LoRA on {path}: {_first_line(e)}") from e
            seen[signature] = tree_flatten(wrapped.trainable_parameters())
        params += [(f"{prefix}.{k}", v) for k, v in seen[signature]]
    return params


def full_parameters(model: nn.Module, num_layers: int) -> list[tuple[str, mx.array]]:
    """mlx_lm/lora.py, fine_tune_type full: only the last num_layers blocks unfreeze."""
    return [(f"layers.{i}.{k}", v) for i in _last_blocks(model, num_layers) for k, v in block_arrays(model, i)]
