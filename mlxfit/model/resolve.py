"""Resolve `--model` into a sized model: a local folder, the built-in catalog,
a Hugging Face repo id (config.json only), or a bare size such as `7B`."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from .. import data_text
from ..errors import BadInput, MlxfitError
from ..files import read_text
from .architecture import Architecture, architecture_from_config
from .bounds import check_bounds
from .lazy_model import NotSizable, UnknownModelType, config_key, text_config
from .weight_files import WeightFiles, cached_hub, fetch_hub, loaded_config, read_folder

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # mlx_lm.lora's own default model
# Where a model's dtype and bits came from: its weight files' headers, config.json
# alone, config.json stating no dtype (bfloat16 assumed), a catalog id's suffix
# (-4bit, -bf16), or nothing at all (a bare size).
SOURCES = ("weight files", "config", "unstated", "name", "assumed")
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
    # Why there is no architecture for a model with a config: the installed
    # mlx-lm has no model for its model_type, so only the rule of thumb answers.
    rule_only_reason: str | None = None
    # A slice of the model (mlxfit/measure/slicing.py): only its last `slice_blocks` blocks.
    slice_blocks: int | None = None
    # Where the float dtype and the bits came from (SOURCES), the bits of the
    # quantized layers as loaded, and what the weight files' headers held.
    dtype_source: str = "assumed"
    bits_source: str | None = None
    bits_mix: tuple[int, ...] = ()
    weight_files: dict | None = None

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    @cached_property
    def config_key(self) -> str:
        """The config as the key its lazily built models are cached by (made once:
        a plan sizes a few hundred runs of one model)."""
        return config_key(self.config)

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
            "rule_only_reason": self.rule_only_reason,
            "dtype_source": self.dtype_source,
            "bits_source": self.bits_source,
            "bits_mix": list(self.bits_mix) or None,
            "weight_files": self.weight_files,
        }


@lru_cache(maxsize=1)
def catalog_entries() -> list[dict]:
    return json.loads(data_text("catalog.json"))["models"]


@lru_cache(maxsize=1)
def catalog() -> dict[str, tuple[str, dict]]:
    """Lower-cased hub id -> (hub id, config), from the shipped data file."""
    return {m["id"].lower(): (m["id"], m["config"]) for m in catalog_entries()}


_SIZE_TOKEN = re.compile(r"^(\d+(\.\d+)?[bBmM]|\d+x\d+[bB]|[aAeE]\d+[bB]|\d+k)$")
_STORAGE_TOKEN = re.compile(r"^(\d+bit|bf16|fp16|mlx)$", re.IGNORECASE)  # an mlx-community conversion's suffix
_SUFFIXES = ("instruct", "it", "base", "chat")


def family(model_id: str) -> str:
    """The family's name as its maker writes it: the words before the size
    (Llama-3.2-1B-Instruct -> Llama 3.2), spelled as the catalog spells that
    family where the words do not (gemma-2-2b-it -> Gemma 2, and so any id of it,
    mlx-community/gemma-2-9b-it-4bit too)."""
    words = _words_before_size(model_id)
    return _family_spellings().get(words.lower(), words)


def _words_before_size(model_id: str) -> str:
    words = []
    for word in model_id.split("/")[-1].split("-"):
        if _SIZE_TOKEN.match(word) or _STORAGE_TOKEN.match(word) or word.lower() in _SUFFIXES:
            break
        words.append(word)
    return " ".join(words) or model_id


@lru_cache(maxsize=1)
def _family_spellings() -> dict[str, str]:
    """Lower-cased id words -> the catalog's `family`, for the entries that name one."""
    return {_words_before_size(e["id"]).lower(): e["family"] for e in catalog_entries() if "family" in e}


def catalog_rows() -> list[dict]:
    """What `mlxfit models` lists: family, size and architecture of each entry."""
    rows = []
    for entry in catalog_entries():
        info = from_catalog(entry["id"])
        arch = info.architecture
        rows.append({
            "id": entry["id"],
            "family": family(entry["id"]),
            "model_type": info.model_type,
            "params": info.params,
            "active_params": arch.active_params if arch else info.params,
            "architecture": arch.describe() if arch else info.rule_only_reason,
            "quantized": info.quantized,
        })
    order = {f: i for i, f in reversed(list(enumerate(r["family"] for r in rows)))}
    return sorted(rows, key=lambda r: order[r["family"]])


def _storage(config: dict) -> tuple[int, int | None, str]:
    """(bits per weight, group size, dtype name) of the stored base. A value that
    names no storage is refused, naming its field, rather than sized as another."""
    quant = config.get("quantization") or {}
    if quant:
        if not isinstance(quant, dict):
            raise MlxfitError(f"config.json field 'quantization' must be an object, got {quant!r}")
        bits, group_size = quant.get("bits", 4), quant.get("group_size", 64)
        if not _whole(bits) or not 1 <= bits <= 8:
            raise MlxfitError(f"config.json field 'quantization.bits' must be an integer from 1 to 8 (bits per weight), got {bits!r}")
        if not _whole(group_size) or group_size < 1:
            raise MlxfitError(f"config.json field 'quantization.group_size' must be a positive integer, got {group_size!r}")
        return int(bits), int(group_size), "quantized"
    inner = text_config(config)
    for where, c in (("text_config.", inner), ("", config)) if inner is not config else (("", config),):
        for name in ("torch_dtype", "dtype"):
            value = c.get(name)
            if value is not None and value not in _DTYPE_BITS:
                raise MlxfitError(
                    f"config.json field '{where}{name}' is {value!r}, not a dtype mlx-lm trains in "
                    f"({', '.join(_DTYPE_BITS)})"
                )
    dtype = inner.get("torch_dtype") or inner.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return _DTYPE_BITS[dtype], None, dtype


def _whole(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == int(value)


def _from_config(model_id: str, source: str, config: dict, path=None, files: WeightFiles | None = None,
                 unread: str | None = None, stated: str = "config") -> ModelInfo:
    """`files`: the weight files' headers, which decide the dtype and bits where they
    are read (mlxfit/model/weight_files.py); `unread`: why they were not; `stated`:
    the source of what the config states (SOURCES)."""
    if not isinstance(config, dict):
        raise MlxfitError(f"config.json of {model_id} is not a JSON object")
    check_bounds(config)  # before anything is built: a config of 100,000 layers would take minutes
    bits, group_size, dtype = _storage(config)
    sources = {
        "dtype_source": stated if stated != "config" or _states_dtype(config) else "unstated",
        "bits_source": stated if bits < 16 else None,
        "weight_files": {"unread": unread} if unread else None,
    }
    if files is not None:
        loaded = loaded_config(config, files)
        config = loaded.config
        bits, group_size, dtype = _storage(config)
        sources = {
            "dtype_source": "weight files" if loaded.dtype_from_files else sources["dtype_source"],
            "bits_source": ("weight files" if loaded.bits_from_files else sources["bits_source"]) if bits < 16 else None,
            "bits_mix": loaded.bits_mix if len(loaded.bits_mix) > 1 else (),
            "weight_files": files.summary(),
        }
    try:
        arch = architecture_from_config(config)
    except NotSizable as e:
        return _rule_only(model_id, source, config, path, e, bits, group_size, dtype, sources)
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
        **sources,
    )


def _states_dtype(config: dict) -> bool:
    return any(c.get(name) is not None for c in (config, text_config(config)) for name in ("torch_dtype", "dtype"))


def _rule_only(model_id, source, config, path, error: NotSizable, bits, group_size, dtype, sources) -> ModelInfo:
    """A model_type mlx-lm cannot build still gets the rule of thumb, from a
    parameter count: the checkpoint's index when present, else the config."""
    params, counted_from = None, None
    if path is not None:
        params, counted_from = index_params(Path(path), bits), "model.safetensors.index.json"
    if not params:
        params, counted_from = config_params(config), "config.json, approximately"
    if not params:
        raise MlxfitError(f"{error}, and config.json has no sizes to count its parameters from")
    from .mlx_lm_modules import version

    if isinstance(error, UnknownModelType):
        why = f"the installed mlx-lm {version()} has no model for model_type {error.model_type!r}"
    else:
        why = str(error)
    reason = f"{why}: rule of thumb only, from {params:,} parameters ({counted_from})"
    return ModelInfo(
        id=model_id, source=source, params=params, bits=bits, dtype=dtype, model_type=config.get("model_type"),
        group_size=group_size, config=config, path=path, rule_only_reason=reason, **sources,
    )


_ORIGINALS: dict = {}


def original_weights(model: ModelInfo) -> ModelInfo | None:
    """A quantized model as it was before quantization: the same config without its
    `quantization` (or quantization_config), in its float dtype (bfloat16 unless the
    config says). None when the model is not quantized or has no architecture."""
    if not model.quantized or model.architecture is None or not model.config:
        return None
    key = (model.id, model.config_key, model.slice_blocks)
    if key not in _ORIGINALS:
        config = {k: v for k, v in model.config.items() if k not in ("quantization", "quantization_config")}
        if isinstance(config.get("text_config"), dict):
            config["text_config"] = {k: v for k, v in config["text_config"].items() if k != "quantization_config"}
        try:
            original = _from_config(f"{model.id} (original weights)", model.source, config, model.path)
        except MlxfitError:
            original = None
        if original is not None and original.architecture is not None:
            from dataclasses import replace

            original = replace(original, slice_blocks=model.slice_blocks)
        _ORIGINALS[key] = original if original is not None and original.architecture is not None else None
    return _ORIGINALS[key]


def index_params(folder: Path, bits: int) -> int | None:
    """Parameters from model.safetensors.index.json's total size and the storage bits."""
    index = folder / "model.safetensors.index.json" if folder.is_dir() else None
    if index is None or not index.is_file():
        return None
    try:
        total = json.loads(index.read_text())["metadata"]["total_size"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(total * 8 // bits) if isinstance(total, (int, float)) and total > 0 else None


def config_params(config: dict) -> int | None:
    """A transformer's parameter count from the usual config fields (approximate:
    attention, a gated MLP or its experts, embeddings)."""
    c = text_config(config)

    def size(*names):
        return next((int(c[n]) for n in names if isinstance(c.get(n), (int, float)) and c[n] > 0), 0)

    h = size("hidden_size", "n_embd", "d_model")
    layers = size("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    vocab = size("vocab_size")
    if not (h and layers and vocab):
        return None
    heads = size("num_attention_heads", "n_head") or max(h // 128, 1)
    kv = size("num_key_value_heads") or heads
    d = size("head_dim") or h // heads
    inter = size("intermediate_size", "n_inner", "ffn_dim", "mlp_hidden_size") or 4 * h
    experts = size("num_experts", "num_local_experts", "n_routed_experts")
    expert_inter = size("moe_intermediate_size") or inter
    mlp = 3 * h * (expert_inter * experts if experts else inter)
    attention = 2 * h * heads * d + 2 * h * kv * d
    tied = c.get("tie_word_embeddings", c.get("weight_tying", True))
    return layers * (attention + mlp + 2 * h) + vocab * h * (1 if tied else 2) + h


def read_config_file(path: Path) -> dict:
    text = read_text(path)  # one line for a binary file or another encoding
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MlxfitError(f"{path} is not valid JSON: {e.msg.removesuffix(' at')} at line {e.lineno}") from e


def from_config(model_id: str, config: dict) -> ModelInfo:
    """A model sized from a config.json's content alone (no files: its dtype as stated)."""
    return _from_config(model_id, "config", config)


def from_folder(folder: Path) -> ModelInfo:
    config_path = folder / "config.json" if folder.is_dir() else folder
    if not config_path.is_file():
        raise MlxfitError(f"{folder} has no config.json")
    config = read_config_file(config_path)
    files = read_folder(folder) if folder.is_dir() else None
    return _from_config(str(folder), "local", config, path=folder, files=files)


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
            return _from_config(model_id, "catalog", config, stated="name")
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
        return _from_hub_config(repo_id, Path(cached))
    from huggingface_hub import constants

    proxy = _proxy_for(constants.ENDPOINT)
    if not constants.HF_HUB_OFFLINE and not _reachable(constants.ENDPOINT):
        unreachable = (f"the proxy {proxy} (from the environment) cannot be reached" if proxy
                       else f"{constants.ENDPOINT} cannot be reached (offline?)")
        raise MlxfitError(
            f"unknown model {repo_id!r}: not a local folder, not in the built-in catalog (`mlxfit models`), "
            f"not in the Hugging Face cache, and {unreachable}"
        )
    try:
        with _quiet_hub():
            path = hf_hub_download(repo_id, "config.json", etag_timeout=HUB_TIMEOUT_S)
    except LocalEntryNotFoundError as e:
        raise MlxfitError(
            f"unknown model {repo_id!r}: not a local folder, not in the built-in catalog, "
            "and its config.json is not in the Hugging Face cache "
            + ("(offline?)" if not proxy or constants.HF_HUB_OFFLINE
               else f"nor could it be fetched through the proxy {proxy}: {_first_line(e)}")
        ) from e
    except RepositoryNotFoundError as e:
        raise MlxfitError(f"unknown model {repo_id!r}: no such repository on the Hugging Face Hub") from e
    except EntryNotFoundError as e:
        raise MlxfitError(f"{repo_id!r} on the Hugging Face Hub has no config.json") from e
    except Exception as e:  # network errors come in many types
        through = f" through the proxy {proxy}" if proxy else ""
        raise MlxfitError(f"could not fetch config.json of {repo_id!r}{through}: {_first_line(e)}") from e
    return _from_hub_config(repo_id, Path(path))


def _from_hub_config(repo_id: str, config_path: Path) -> ModelInfo:
    """The model of a config.json in the Hugging Face cache, with its weight files'
    headers (of the same commit) where they can be had."""
    config = read_config_file(config_path)
    commit = config_path.parent.name if re.fullmatch(r"[0-9a-f]{40}", config_path.parent.name) else None
    files, unread = hub_weight_files(repo_id, commit)
    return _from_config(repo_id, "hub", config, files=files, unread=unread)


def hub_weight_files(repo_id: str, revision: str | None) -> tuple[WeightFiles | None, str | None]:
    """(the weight files' headers, None) from mlxfit's cache or the hub, else
    (None, why not): the config alone then sizes the model, and says so."""
    cached = cached_hub(repo_id, revision)
    if cached is not None:
        return cached, None
    from huggingface_hub import constants
    from huggingface_hub.errors import NotASafetensorsRepoError

    if constants.HF_HUB_OFFLINE:
        return None, "offline (HF_HUB_OFFLINE): the weight files' headers are not in mlxfit's cache"
    if not _reachable(constants.ENDPOINT):
        return None, f"{constants.ENDPOINT} cannot be reached: the weight files' headers could not be fetched"
    try:
        with _quiet_hub():
            return fetch_hub(repo_id, revision, HEADERS_TIMEOUT_S), None
    except NotASafetensorsRepoError:
        return None, "the repository has no safetensors weights"
    except Exception as e:  # network and parsing errors come in many types
        return None, f"the weight files' headers could not be fetched ({type(e).__name__})"


HUB_TIMEOUT_S = 2.5
HEADERS_TIMEOUT_S = 10.0  # per header request, once the hub is known to answer (huggingface_hub's default)
# The tokenizer's files, as small and as public as config.json (never weights);
# tokenizer.model (SentencePiece) is fetched where there is no tokenizer.json.
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "chat_template.jinja",
                   "config.json")


def fetch_tokenizer(repo_id: str) -> tuple[Path | None, str]:
    """(the folder of repo_id's tokenizer files, fetched as config.json is: through
    huggingface_hub, its cache and HF_HUB_OFFLINE), or (None, why not), never an error:
    without a tokenizer, --data is counted by characters and says so."""
    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return None, "huggingface_hub is missing"
    if constants.HF_HUB_OFFLINE:
        return None, f"the tokenizer of {repo_id} is not in the Hugging Face cache, and HF_HUB_OFFLINE is set"
    if not _reachable(constants.ENDPOINT):
        return None, f"the tokenizer of {repo_id} is not in the Hugging Face cache, and {constants.ENDPOINT} cannot be reached"

    def fetch(name: str) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, name, etag_timeout=HUB_TIMEOUT_S))
        except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: offline, not an absent file
            raise
        except EntryNotFoundError:
            return None

    try:
        with _quiet_hub():
            fetched = {name: fetch(name) for name in TOKENIZER_FILES}
            if fetched["tokenizer.json"] is None:
                fetched["tokenizer.model"] = fetch("tokenizer.model")
    except LocalEntryNotFoundError:
        return None, f"the tokenizer of {repo_id} is not in the Hugging Face cache (offline?)"
    except Exception as e:  # network and permission errors come in many types (a gated repository among them)
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        return None, f"could not fetch the tokenizer of {repo_id}: {reason}"
    tokenizer = fetched["tokenizer.json"] or fetched.get("tokenizer.model")
    if tokenizer is None:
        return None, f"{repo_id} on the Hugging Face Hub has no tokenizer.json"
    return tokenizer.parent, "fetched from the Hugging Face Hub"


def _reachable(endpoint: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Can a connection to the hub, or to the proxy the environment names for it, be
    opened at all? (huggingface_hub retries a failed lookup five times, 8 s apart,
    before it gives up.)"""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(_proxy_for(endpoint) or endpoint)
    port = parsed.port or {"https": 443, "socks5": 1080, "socks5h": 1080}.get(parsed.scheme, 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout).close()
        return True
    except (OSError, ValueError):
        return False


def _proxy_for(url: str) -> str | None:
    """The proxy that huggingface_hub's HTTP client (httpx or requests) takes from the
    environment for `url`: HTTPS_PROXY or HTTP_PROXY by its scheme, else ALL_PROXY, unless
    NO_PROXY names its host, as urllib reads them (credentials left out); None for a
    direct connection."""
    from urllib.parse import urlparse
    from urllib.request import getproxies, proxy_bypass

    parsed = urlparse(url)
    proxies = getproxies()
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy or not parsed.hostname or proxy_bypass(parsed.hostname):
        return None
    shown = urlparse(proxy if "://" in proxy else f"http://{proxy}")
    # As it is named in messages: without a user name and password.
    return shown._replace(netloc=shown.netloc.rpartition("@")[2]).geturl()


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


@contextmanager
def _quiet_hub():
    """huggingface_hub logs each retry as a warning; the error is reported once."""
    import logging

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def resolve_model(spec: str | None) -> ModelInfo:
    spec = DEFAULT_MODEL if spec is None else spec.strip()
    if not spec:
        raise BadInput("--model is empty: give a folder, a catalog id, a Hugging Face repo id or a size like 7B, or leave it out for the default")
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
