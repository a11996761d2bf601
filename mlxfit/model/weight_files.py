"""What a model's weight files hold, read from their safetensors headers only.

A safetensors file opens with an 8-byte little-endian length and a JSON header
that names every tensor with its dtype, shape and byte offsets
(https://huggingface.co/docs/safetensors/index#format): a few KB, whatever the
size of the weights. mlx_lm/utils.py load_model loads `model*.safetensors` as
stored, so these headers say what config.json may not: the float dtype the
model trains in (a conversion's config often states none) and the bits of every
quantized layer (load_model's class_predicate reads them from the shapes of a
layer's `weight` and `scales` when the config's `quantization` block does not
name the layer).

`loaded_config` writes those facts back into the config in mlx-lm's own terms
(`torch_dtype`, and per-layer entries of `quantization`, a dict or False), so
everything sized from the config (weights, the reference copy, QLoRA bases, full
fine-tunes, the measurement's random weights) counts the bytes the files hold.
For a Hugging Face id the headers come from the hub without the weights
(huggingface_hub.get_safetensors_metadata) and are kept in mlxfit's cache.
"""

from __future__ import annotations

import glob
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import cache_dir
from ..errors import MlxfitError

WEIGHT_FILES = "model*.safetensors"  # mlx_lm/utils.py load_model's glob
FLOAT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit
# mlx_lm/utils.py infer_quant_config: scales stored as uint8 mean one of these modes.
_PACKED_SCALE_MODES = {(4, 16): "nvfp4", (4, 32): "mxfp4", (8, 32): "mxfp8"}


@dataclass(frozen=True)
class Tensor:
    dtype: str  # safetensors' code: F32, BF16, F16, U32, U8, ...
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class WeightFiles:
    tensors: dict = field(repr=False)  # name -> Tensor
    where: str  # "folder" | "hub"

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def float_dtype(self) -> str | None:
        """The float dtype holding most bytes (the model's; a few tensors may be kept
        in another), None when no tensor is a float."""
        by_dtype: dict[str, int] = {}
        for t in self.tensors.values():
            if t.dtype in FLOAT_DTYPES:
                by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.nbytes
        return FLOAT_DTYPES[max(by_dtype, key=by_dtype.get)] if by_dtype else None

    def summary(self) -> dict:
        return {"from": self.where, "tensors": len(self.tensors), "bytes": self.nbytes}


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors one safetensors file holds, from its header alone."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            size = Path(path).stat().st_size
            if length is None or not 2 <= length <= min(_MAX_HEADER, size - 8):
                raise MlxfitError(f"{path} is not a safetensors file (a Git LFS pointer, or cut short?)")
            header = json.loads(f.read(length))
    except OSError as e:
        raise MlxfitError(f"cannot read {path}: {e.strerror}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise MlxfitError(f"{path} has no readable safetensors header") from e
    try:
        return {name: _tensor(info["dtype"], info["shape"], info["data_offsets"])
                for name, info in header.items() if name != "__metadata__"}
    except (KeyError, TypeError, ValueError) as e:
        raise MlxfitError(f"{path} has a safetensors header without a tensor's dtype, shape or offsets") from e


def _tensor(dtype, shape, offsets) -> Tensor:
    begin, end = offsets
    return Tensor(str(dtype), tuple(int(n) for n in shape), int(end) - int(begin))


def read_folder(folder: Path) -> WeightFiles | None:
    """The weight files mlx-lm would load from this folder; None when it has none."""
    if not folder.is_dir():
        return None
    paths = sorted(glob.glob(str(folder / WEIGHT_FILES)))
    if not paths:
        return None
    tensors = {}
    for path in paths:
        tensors.update(read_header(Path(path)))
    return WeightFiles(tensors, "folder")


# -- a Hugging Face repo: the headers without the weights, kept in mlxfit's cache


def cache_path(repo_id: str, revision: str | None) -> Path:
    name = repo_id.replace("/", "--")
    return cache_dir() / "weight-files" / f"{name}@{revision or 'main'}.json"


def cached_hub(repo_id: str, revision: str | None) -> WeightFiles | None:
    try:
        rows = json.loads(cache_path(repo_id, revision).read_text())
        return WeightFiles({name: _tensor(*row) for name, row in rows.items()}, "hub")
    except (OSError, ValueError, TypeError):
        return None


def fetch_hub(repo_id: str, revision: str | None, timeout: float) -> WeightFiles:
    """The headers of the repo's safetensors files (huggingface_hub fetches a few KB
    of each file, never the weights), then kept in the cache. Raises what
    huggingface_hub raises."""
    import huggingface_hub

    metadata = huggingface_hub.get_safetensors_metadata(repo_id, revision=revision, timeout=timeout)
    tensors = {name: _tensor(info.dtype, info.shape, info.data_offsets)
               for file in metadata.files_metadata.values() for name, info in file.tensors.items()}
    files = WeightFiles(tensors, "hub")
    _keep(cache_path(repo_id, revision), {name: [t.dtype, list(t.shape), [0, t.nbytes]] for name, t in tensors.items()})
    return files


def _keep(path: Path, rows: dict) -> None:
    """Written whole or not at all; a cache that cannot be written is no error."""
    from ..files import write_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda f: f.write(json.dumps(rows).encode()))
    except OSError:
        pass


# -- the config as mlx-lm loads these files


@dataclass(frozen=True)
class Loaded:
    config: dict  # config.json with the files' dtype and per-layer bits written in
    dtype_from_files: bool  # the float dtype came from the files
    bits_from_files: bool  # the quantized layers' bits were checked against the files
    bits_mix: tuple[int, ...]  # the bits of the quantized layers, as loaded


def loaded_config(config: dict, files: WeightFiles) -> Loaded:
    """config.json as mlx_lm/utils.py load_model loads these files: the float dtype
    they store (load_model casts nothing) and, for a quantized model, every layer
    whose stored bits, group size or mode differ from what the config's
    `quantization` block gives, written as load_model's per-layer entries (the
    layer's own dict, or False where the files hold it unquantized). The config
    is returned unchanged where the files agree with it."""
    from . import lazy_model

    dtype = files.float_dtype
    if dtype is not None and lazy_model.checkpoint_dtype(config) != lazy_model.DTYPES[dtype]:
        config = _with_dtype(config, dtype)
    quant = lazy_model._quantization(config)
    if not quant:
        return Loaded(config, dtype is not None, False, ())
    try:
        built = lazy_model.built_for_key(lazy_model.config_key(config))
    except MlxfitError:  # sized (or refused) from the config alone, as before
        return Loaded(config, dtype is not None, False, ())
    overrides, bits, matched = _quantized_layers(built, quant, files.tensors)
    if overrides:
        config = {**config, "quantization": {**quant, **overrides}}
    return Loaded(config, dtype is not None, matched > 0, tuple(sorted(bits)))


def _with_dtype(config: dict, dtype: str) -> dict:
    """The config stating `dtype` wherever it states one, and as torch_dtype."""
    config = {k: v for k, v in config.items()}
    inner = config.get("text_config")
    if isinstance(inner, dict):
        config["text_config"] = {k: (dtype if k in ("torch_dtype", "dtype") and v is not None else v)
                                 for k, v in inner.items()}
    if config.get("dtype") is not None:
        config["dtype"] = dtype
    config["torch_dtype"] = dtype
    return config


def _quantized_layers(model, quant: dict, tensors: dict) -> tuple[dict, set[int], int]:
    """(per-layer entries where the files differ from the built model, the bits of
    every quantized layer as loaded, how many layers the files name)."""
    from .module_tree import leaf_modules

    overrides, bits, matched = {}, set(), 0
    for path, module in leaf_modules(model):
        if "weight" not in module or not ("scales" in module or hasattr(module, "to_quantized")):
            continue
        built = ({"group_size": module.group_size, "bits": module.bits, "mode": getattr(module, "mode", "affine")}
                 if "scales" in module else False)
        stored = tensors.get(f"{path}.weight")
        real = built
        if path not in quant and stored is not None:  # load_model honours a layer the config names
            matched += 1
            in_dims = module.weight.shape[-1] * 32 // module.bits if "scales" in module else module.weight.shape[-1]
            inferred = _inferred(in_dims, stored, tensors.get(f"{path}.scales"))
            if inferred is not None and inferred != built:
                overrides[path] = real = inferred
        if real:
            bits.add(real["bits"])
    return overrides, bits, matched


def _inferred(in_dims: int, weight: Tensor, scales: Tensor | None):
    """mlx_lm/utils.py infer_quant_config: the group size, bits and mode a stored
    layer was packed with (False: stored unquantized; None: not readable so)."""
    if scales is None:
        return False
    if not weight.shape or not scales.shape or not in_dims or in_dims % scales.shape[-1] or (weight.shape[-1] * 32) % in_dims:
        return None
    group_size, bits = in_dims // scales.shape[-1], weight.shape[-1] * 32 // in_dims
    if scales.dtype != "U8":
        return {"group_size": group_size, "bits": bits, "mode": "affine"}
    mode = _PACKED_SCALE_MODES.get((bits, group_size))
    return {"group_size": group_size, "bits": bits, "mode": mode} if mode else None
