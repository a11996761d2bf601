"""Read mlx-lm's own YAML training config (`mlx_lm.lora -c lora.yaml`) and merge it
with mlxfit's flags the way `mlx_lm.lora.main()` does: a flag that is not None wins,
then the file's value, then the default (training.defaults(), pinned to CONFIG_DEFAULTS).

mlx_lm is not imported here (it pulls in transformers); its YAML loader is mirrored
below and pinned by tests/test_model_runconfig.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from ..errors import BadInput, MlxfitError
from .training import TrainingConfig, defaults

# mlx_lm/lora.py: yaml_loader adds this float resolver so that `1e-5` is a float
# (YAML 1.1 wants a dot). mlx-lm adds it to yaml.SafeLoader itself; we use a subclass.
_FLOAT = re.compile(
    """^(?:
     [-+]?(?:[0-9][0-9_]*)\\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\\.[0-9_]*
    |[-+]?\\.(?:inf|Inf|INF)
    |\\.(?:nan|NaN|NAN))$""",
    re.X,
)


@lru_cache(maxsize=1)
def yaml_loader():
    """yaml.SafeLoader plus mlx-lm's float resolver (PyYAML imported only for -c)."""
    import yaml

    class YamlLoader(yaml.SafeLoader):
        pass

    YamlLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return YamlLoader

# Keys mlx_lm.lora knows: CONFIG_DEFAULTS, the parser's dests, and the keys its
# dataset loader reads with getattr (mlx_lm/tuner/datasets.py).
CONFIG_KEYS = frozenset(
    {
        # CONFIG_DEFAULTS
        "model", "train", "fine_tune_type", "optimizer", "optimizer_config", "data", "seed",
        "num_layers", "batch_size", "iters", "val_batches", "learning_rate", "steps_per_report",
        "steps_per_eval", "resume_adapter_file", "adapter_path", "save_every", "test",
        "test_batches", "max_seq_length", "config", "grad_checkpoint", "grad_accumulation_steps",
        "clear_cache_threshold", "lr_schedule", "lora_parameters", "mask_prompt", "report_to",
        "project_name", "trust_remote_code",
        # read by mlx_lm.tuner.datasets
        "hf_dataset", "prompt_feature", "completion_feature", "text_feature", "chat_feature",
    }
)
# build_parser() gives these a default that is not None, so main() never takes them
# from the file: a file's value is dropped without a word.
OVERRIDDEN_BY_PARSER = ("clear_cache_threshold", "trust_remote_code")
LORA_KEYS = ("rank", "scale", "dropout", "keys")  # what linear_to_lora_layers reads
FEATURE_KEYS = ("prompt_feature", "completion_feature", "text_feature", "chat_feature")

_TRAINING = {f.name: f for f in fields(TrainingConfig)}
_FILE_TRAINING = ("fine_tune_type", "optimizer", "num_layers", "batch_size", "max_seq_length",
                  "grad_checkpoint", "grad_accumulation_steps")
_FLAG_KEYS = frozenset(_TRAINING) | {"model", "data", "mask_prompt"}


@dataclass(frozen=True)
class ResolvedConfig:
    training: TrainingConfig
    model: str | None = None  # None: mlx-lm's default model (mlxfit.model.resolve.DEFAULT_MODEL)
    data: str | None = None  # None: not given (mlx-lm would use mlx-community/WikiSQL)
    mask_prompt: bool = False
    features: dict[str, str] = field(default_factory=dict)  # prompt_feature, ... from the file
    other: dict = field(default_factory=dict)  # other known keys from the file (iters, ...)
    sources: dict[str, str] = field(default_factory=dict)  # key -> "flag" | "file" | "default"
    unknown_keys: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)  # known, but mlx-lm never reads them from a file
    config_file: str | None = None

    def value(self, key: str):
        if key in _TRAINING:
            return getattr(self.training, key)
        if key in ("model", "data", "mask_prompt"):
            return getattr(self, key)
        if key in self.features:
            return self.features[key]
        return self.other[key]

    def to_dict(self) -> dict:
        return {
            "config_file": self.config_file,
            "config": {k: {"value": _jsonable(self.value(k)), "source": s} for k, s in self.sources.items()},
            "unknown_keys": list(self.unknown_keys),
            "ignored_keys": list(self.ignored_keys),
        }


def _jsonable(value):
    """YAML can hold dates and the like; JSON cannot."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def load_yaml(path: Path) -> dict:
    """The file as mlx_lm.lora reads it, checked to be a mapping."""
    import yaml

    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fid:
            data = yaml.load(fid, yaml_loader())
    except FileNotFoundError as e:
        raise BadInput(f"config file {path} not found") from e
    except IsADirectoryError as e:
        raise BadInput(f"config file {path} is a directory") from e
    except OSError as e:
        raise MlxfitError(f"cannot read config file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise BadInput(f"config file {path} is not UTF-8 text") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise BadInput(f"config file {path} is not valid YAML: {problem}{where}") from e
    if data is None:
        raise BadInput(f"config file {path} is empty")
    if not isinstance(data, dict):
        raise BadInput(f"config file {path} must be a mapping of options, not a {_yaml_type(data)}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise BadInput(f"config file {path}: option names must be text, got {bad[0]!r}")
    return data


def resolve(flags: dict, config_path: Path | None = None) -> ResolvedConfig:
    """Merge mlxfit's flags (None: not given) with the config file and the defaults."""
    extra = set(flags) - _FLAG_KEYS
    if extra:
        raise ValueError(f"unknown flag keys: {sorted(extra)}")
    file = load_yaml(config_path) if config_path is not None else {}
    where = f"config file {config_path}"
    # mlx-lm treats a null value in the file like a missing one.
    given = {k: v for k, v in file.items() if v is not None}
    unknown = sorted(k for k in file if k not in CONFIG_KEYS)

    values, sources = {}, {}

    def pick(key, file_value, default):
        if flags.get(key) is not None:
            values[key], sources[key] = flags[key], "flag"
        elif file_value is not None:
            values[key], sources[key] = file_value, "file"
        else:
            values[key], sources[key] = default, "default"

    base = defaults()
    for key in _FILE_TRAINING:
        value = given.get(key)
        if value is not None:
            value = _check(where, key, value, _TRAINING[key].type)
            if key == "optimizer":
                value = value.lower()  # mlx-lm: args.optimizer.lower()
        pick(key, value, base[key])

    lora, lora_keys = {}, None
    if "lora_parameters" in given:
        lora = given["lora_parameters"]
        if not isinstance(lora, dict):
            raise BadInput(f"{where}: lora_parameters must be a mapping, not a {_yaml_type(lora)}")
        unknown += sorted(f"lora_parameters.{k}" for k in lora if k not in LORA_KEYS)
        if values["fine_tune_type"] != "full":  # mlx-lm ignores lora_parameters for full
            _check_lora_complete(where, lora)
        if lora.get("keys") is not None:
            keys = lora["keys"]
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise BadInput(f"{where}: lora_parameters.keys must be a list of layer names")
            lora_keys = tuple(keys)
    pick("lora_keys", lora_keys, None)
    for key in ("rank", "scale", "dropout"):
        value = lora.get(key)
        if value is not None:
            value = _check(where, f"lora_parameters.{key}", value, _TRAINING[key].type)
        pick(key, value, base[key])
    if values["fine_tune_type"] == "full":
        values["lora_keys"] = None  # mlx-lm ignores lora_parameters for full fine-tuning
    for key in _TRAINING:  # mlxfit's own (quantize, bits, ...): no mlx-lm config key
        if key not in values:
            pick(key, None, base[key])

    for key in ("model", "data"):
        value = given.get(key)
        if value is not None:
            value = _check(where, key, value, "str")
        pick(key, value, None)
    value = given.get("mask_prompt")
    pick("mask_prompt", None if value is None else _check(where, "mask_prompt", value, "bool"), False)

    features = {k: _check(where, k, given[k], "str") for k in FEATURE_KEYS if k in given}
    ignored = sorted(k for k in given if k in OVERRIDDEN_BY_PARSER)
    other = {k: v for k, v in given.items()
             if k in CONFIG_KEYS and k not in values and k not in features and k not in ignored
             and k != "lora_parameters"}

    from_file = {k: values[k] for k in _TRAINING if sources[k] == "file"}
    if from_file:  # name the file when its own values are out of range
        try:
            TrainingConfig(**{**base, **from_file})
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from e
    training = TrainingConfig(**{k: values[k] for k in _TRAINING})
    sources.update({k: "file" for k in (*features, *other)})
    return ResolvedConfig(
        training=training,
        model=values["model"],
        data=values["data"],
        mask_prompt=values["mask_prompt"],
        features=features,
        other=other,
        sources=sources,
        unknown_keys=unknown,
        ignored_keys=ignored,
        config_file=str(config_path) if config_path is not None else None,
    )


def _check_lora_complete(where: str, lora: dict) -> None:
    # mlx_lm/tuner/utils.py: linear_to_lora_layers reads config["scale"], ["rank"], ["dropout"].
    if "scale" not in lora:
        hint = ""
        if "alpha" in lora:
            hint = (
                " Found 'alpha' instead — mlx-lm's LoRA config uses 'scale', "
                "not 'alpha' (unlike some other LoRA frameworks). See LORA.md."
            )
        raise BadInput(f"{where}: LoRA config is missing required key 'scale'.{hint}")
    for key in ("rank", "dropout"):
        if key not in lora:
            raise BadInput(
                f"{where}: lora_parameters lacks {key!r}; mlx-lm reads rank, scale and dropout "
                "from it and does not fill in defaults"
            )


_TYPE_NAMES = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "text"}


def _check(where: str, key: str, value, kind: str):
    """The value if it has the type mlx-lm expects for key, else BadInput."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }[kind]
    if not ok:
        raise BadInput(f"{where}: {key} must be {_TYPE_NAMES[kind]}, got {value!r}")
    return float(value) if kind == "float" else value


def _yaml_type(value) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


# --- what only makes sense with the command line's other inputs -------------------


def one_model(positional: str | None, option: str | None) -> str | None:
    """`mlxfit probe MODEL` and `--model MODEL` name the same thing; given both,
    --model wins, so that a plan's `--model ...` pastes onto either form."""
    return option if option is not None else positional


def check_method(method: str | None, fine_tune_type: str | None) -> None:
    """--method is a shortcut for --fine-tune-type (and a 4-bit base): they must agree."""
    if method is None or fine_tune_type is None:
        return
    if (method == "full") != (fine_tune_type == "full"):
        goes_with = "full" if method == "full" else "lora or dora"
        raise BadInput(
            f"--method {method} conflicts with --fine-tune-type {fine_tune_type}: give one "
            f"(--method {method} goes with --fine-tune-type {goes_with})"
        )


def with_method(training: TrainingConfig, method: str | None) -> TrainingConfig:
    """Apply --method to a resolved run (it overrides the config file's fine_tune_type)."""
    from dataclasses import replace

    if method is None:
        return training
    if method == "full":
        return replace(training, fine_tune_type="full", quantize=False)
    fine_tune_type = "lora" if training.fine_tune_type == "full" else training.fine_tune_type
    return replace(training, fine_tune_type=fine_tune_type, quantize=(method == "qlora"))


def check_stored_quantization(resolved: ResolvedConfig, model) -> None:
    """--bits or --group-size on a model stored quantized would change nothing: mlx-lm
    trains the stored quantization as it is and cannot quantize it again. Refused,
    naming what is stored, rather than shown as the stored bits and reported as the flag's."""
    if not model.quantized:
        return
    for key, stored in (("bits", model.bits), ("group_size", model.group_size)):
        given = getattr(resolved.training, key)
        if resolved.sources.get(key) == "flag" and stored is not None and given != stored:
            flag = "--" + key.replace("_", "-")
            raise BadInput(f"{flag} {given}: {model.id} is stored {model.bits}-bit (group {model.group_size}), "
                           f"and mlx-lm trains a stored quantization as it is (it cannot quantize it again): "
                           f"leave {flag} out")


def context_of(model) -> tuple[int | None, bool]:
    """The model's max_position_embeddings (None: not said), and whether its config has
    rope_scaling, which may stretch it."""
    from .architecture import text_config

    config = text_config(model.config or {})
    context = config.get("max_position_embeddings")
    return (context if isinstance(context, int) else None), bool(config.get("rope_scaling"))


def hard_context(model) -> int | None:
    """The context no run may pass: max_position_embeddings where nothing stretches it."""
    context, stretched = context_of(model)
    return None if stretched else context


def check_against_model(training: TrainingConfig, model) -> list[str]:
    """Settings that cannot be right for this model: an error, or a warning where
    the model's config says it may be meant (rope_scaling stretches the context)."""
    warnings: list[str] = []
    if model.architecture is None:
        return warnings
    training.layers_trained(model.architecture.num_layers)
    context, stretched = context_of(model)
    if context is not None and training.max_seq_length > context:
        message = (
            f"--max-seq-length {training.max_seq_length:,} is past {model.id}'s context of "
            f"{context:,} tokens (max_position_embeddings)"
        )
        if not stretched:
            raise BadInput(f"{message}: give {context:,} or less")
        warnings.append(f"{message}; its rope_scaling may stretch that, check the model card")
    if training.fine_tune_type != "full" and training.lora_keys is not None and model.config is not None:
        from .lazy_model import base_model, default_lora_keys

        known = default_lora_keys(base_model(model.config))
        missing = [k for k in training.lora_keys if k not in known]
        if len(missing) == len(training.lora_keys):
            raise BadInput(
                f"lora_parameters.keys {list(training.lora_keys)}: no layer of {model.id}'s blocks has "
                f"{'this name' if len(missing) == 1 else 'these names'}, so nothing would be trained "
                f"(its layers: {', '.join(sorted(known))})"
            )
        if missing:
            warnings.append(f"lora_parameters.keys: {', '.join(missing)} name no layer of {model.id}'s blocks "
                            "and adapt nothing (mlx-lm skips them)")
    return warnings
