"""Resolve `--model` into a sized model: a local folder, the built-in catalog,
a Hugging Face repo id (config.json only), or a bare size such as `7B`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .architecture import Architecture, architecture_from_config, text_config
from .errors import BadInput, MlxfitError

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # mlx_lm.lora's own default model
_BARE_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bBmM])\s*$")
_QUANT_SUFFIX = re.compile(r"-(\d)bit$|-(bf16|fp16|fp32)$", re.IGNORECASE)
_DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}


@dataclass(frozen=True)
class ModelInfo:
    id: str
    source: str  # "local" | "catalog" | "hub" | "size"
    params: int
    bits: int  # bits per weight of the stored base: 32, 16, 8, 4, ...
    dtype: str  # "bfloat16", "float16", "float32", or "quantized"
    model_type: str | None = None
    group_size: int | None = None
    architecture: Architecture | None = None
    config: dict | None = None
    path: Path | None = None

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "source": self.source,
            "model_type": self.model_type,
            "params": self.params,
            "bits": self.bits,
            "dtype": self.dtype,
            "group_size": self.group_size,
            "path": str(self.path) if self.path else None,
        }


@lru_cache(maxsize=1)
def catalog() -> dict[str, tuple[str, dict]]:
    """Lower-cased hub id -> (hub id, config), from the shipped data file."""
    text = resources.files("mlxfit").joinpath("data/catalog.json").read_text()
    return {m["id"].lower(): (m["id"], m["config"]) for m in json.loads(text)["models"]}


def _from_config(model_id: str, source: str, config: dict, path=None) -> ModelInfo:
    if not isinstance(config, dict):
        raise MlxfitError(f"config.json of {model_id} is not a JSON object")
    arch = architecture_from_config(config)
    quant = config.get("quantization") or {}
    if quant:
        bits, group_size, dtype = int(quant.get("bits", 4)), int(quant.get("group_size", 64)), "quantized"
    else:
        inner = text_config(config)
        dtype = inner.get("torch_dtype") or inner.get("dtype") or config.get("torch_dtype") or "bfloat16"
        bits, group_size = _DTYPE_BITS.get(dtype, 16), None
    return ModelInfo(
        id=model_id,
        source=source,
        params=arch.params,
        bits=bits,
        dtype=dtype,
        model_type=arch.model_type,
        group_size=group_size,
        architecture=arch,
        config=config,
        path=path,
    )


def read_config_file(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise MlxfitError(f"{path} is not valid JSON: {e.msg.removesuffix(' at')} at line {e.lineno}") from e
    except OSError as e:
        raise MlxfitError(f"cannot read {path}: {e.strerror}") from e


def from_folder(folder: Path) -> ModelInfo:
    config_path = folder / "config.json" if folder.is_dir() else folder
    if not config_path.is_file():
        raise MlxfitError(f"{folder} has no config.json")
    return _from_config(str(folder), "local", read_config_file(config_path), path=folder)


def from_size(text: str) -> ModelInfo | None:
    match = _BARE_SIZE.match(text)
    if not match:
        return None
    scale = 10**9 if match.group(2).lower() == "b" else 10**6
    params = int(round(float(match.group(1)) * scale))
    if params <= 0:
        raise BadInput(f"model size must be positive, got {text!r}")
    return ModelInfo(id=text.strip().upper(), source="size", params=params, bits=16, dtype="bfloat16")


def from_catalog(model_id: str) -> ModelInfo | None:
    entry = catalog().get(model_id.lower())
    if entry is not None:
        return _from_config(entry[0], "catalog", entry[1])
    # mlx-community conversions: same architecture, other storage.
    name = model_id.split("/")[-1]
    match = _QUANT_SUFFIX.search(name)
    if not match:
        return None
    base = name[: match.start()].lower()
    for key, (hub_id, config) in catalog().items():
        if key.split("/")[-1] == base:
            config = dict(config)
            if match.group(1):
                config["quantization"] = {"bits": int(match.group(1)), "group_size": 64}
            else:
                config["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[match.group(2).lower()]
            return _from_config(model_id, "catalog", config)
    return None


def from_hub(repo_id: str) -> ModelInfo:
    """Fetch config.json only, through huggingface_hub: its cache first, then the
    network unless HF_HUB_OFFLINE is set. Never weights, never remote code."""
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
        from huggingface_hub.errors import (
            EntryNotFoundError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
        )
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise MlxfitError(f"cannot look up {repo_id!r}: huggingface_hub is missing") from e
    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return _from_config(repo_id, "hub", read_config_file(Path(cached)))
    try:
        path = hf_hub_download(repo_id, "config.json")
    except LocalEntryNotFoundError as e:
        raise MlxfitError(
            f"unknown model {repo_id!r}: not a local folder, not in the built-in catalog, "
            "and its config.json is not in the Hugging Face cache (offline?)"
        ) from e
    except RepositoryNotFoundError as e:
        raise MlxfitError(f"unknown model {repo_id!r}: no such repository on the Hugging Face Hub") from e
    except EntryNotFoundError as e:
        raise MlxfitError(f"{repo_id!r} on the Hugging Face Hub has no config.json") from e
    except Exception as e:  # network errors come in many types
        raise MlxfitError(f"could not fetch config.json of {repo_id!r}: {e}") from e
    return _from_config(repo_id, "hub", read_config_file(Path(path)))


def resolve_model(spec: str | None) -> ModelInfo:
    spec = (spec or DEFAULT_MODEL).strip()
    if not spec:
        raise BadInput("--model is empty")
    path = Path(spec).expanduser()
    if path.exists():
        return from_folder(path)
    sized = from_size(spec)
    if sized is not None:
        return sized
    known = from_catalog(spec)
    if known is not None:
        return known
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return from_hub(spec)
    raise MlxfitError(
        f"unknown model {spec!r}: not a folder with config.json, not a catalog id "
        "(see `mlxfit models`), not a size like 7B, and not a Hugging Face repo id"
    )
