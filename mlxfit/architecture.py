"""A transformer's shape, read from a Hugging Face config.json, as mlx-lm builds it.

Each supported `model_type` maps to a builder that lists, per block, the linear
layers mlx-lm creates (with their paths inside the block, so LoRA and quantization
can be reasoned about later) and the norm parameters. Counts must equal
`tree_flatten(model.parameters())` of the mlx-lm model built from the same config
(tests/test_architecture.py checks every builder against the real model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .errors import MlxfitError

# mlx_lm/utils.py: MODEL_REMAPPING (only the entries whose target we model).
MODEL_TYPE_ALIASES = {"mistral": "llama"}


@dataclass(frozen=True)
class Linear:
    """One linear layer inside a block; `experts` > 1 is an mlx-lm SwitchLinear."""

    path: str
    in_features: int
    out_features: int
    bias: bool = False
    experts: int = 1

    @property
    def params(self) -> int:
        per_expert = self.in_features * self.out_features
        if self.bias:
            per_expert += self.out_features
        return self.experts * per_expert


@dataclass(frozen=True)
class Block:
    linears: tuple[Linear, ...]
    norm_params: int

    @property
    def params(self) -> int:
        return sum(l.params for l in self.linears) + self.norm_params


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    blocks: tuple[Block, ...]
    final_norm_params: int
    num_experts: int = 0
    experts_per_token: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def params(self) -> int:
        return sum(self.part_params().values())

    def part_params(self) -> dict[str, int]:
        """Parameter counts by named part, in the spirit of nanoGPT's sizing."""
        attention = mlp = norms = 0
        for block in self.blocks:
            for linear in block.linears:
                if linear.path.startswith(("self_attn.", "attn.")):
                    attention += linear.params
                else:
                    mlp += linear.params
            norms += block.norm_params
        return {
            "embedding": self.embedding_params,
            "attention": attention,
            "mlp": mlp,
            "norms": norms + self.final_norm_params,
            "lm_head": self.lm_head_params,
        }


def _require(config: dict, *keys: str) -> None:
    missing = [k for k in keys if config.get(k) is None]
    if missing:
        raise MlxfitError(
            f"config.json for model_type {config.get('model_type')!r} is missing "
            + ", ".join(repr(k) for k in missing)
        )


def _attention(h: int, heads: int, kv: int, d: int, qkv_bias=False, o_bias=False):
    return (
        Linear("self_attn.q_proj", h, heads * d, qkv_bias),
        Linear("self_attn.k_proj", h, kv * d, qkv_bias),
        Linear("self_attn.v_proj", h, kv * d, qkv_bias),
        Linear("self_attn.o_proj", heads * d, h, o_bias),
    )


def _glu(h: int, inter: int, prefix="mlp.", bias=False, experts=1):
    return (
        Linear(prefix + "gate_proj", h, inter, bias, experts),
        Linear(prefix + "up_proj", h, inter, bias, experts),
        Linear(prefix + "down_proj", inter, h, bias, experts),
    )


def _common(config: dict) -> dict:
    _require(
        config,
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    )
    heads = config["num_attention_heads"]
    return {
        "h": config["hidden_size"],
        "L": config["num_hidden_layers"],
        "heads": heads,
        "kv": config.get("num_key_value_heads") or heads,
        "V": config["vocab_size"],
    }


def _dense(model_type, c, d, inter, linears, norm_params, tied, **extra):
    blocks = tuple(Block(linears, norm_params) for _ in range(c["L"]))
    return Architecture(
        model_type=model_type,
        hidden_size=c["h"],
        num_heads=c["heads"],
        num_kv_heads=c["kv"],
        head_dim=d,
        intermediate_size=inter,
        vocab_size=c["V"],
        tied_embeddings=tied,
        blocks=blocks,
        final_norm_params=c["h"],
        **extra,
    )


def _llama(config: dict) -> Architecture:
    # mlx_lm/models/llama.py: head_dim from config or hidden/heads; biases by flag.
    c = _common(config)
    _require(config, "intermediate_size")
    d = config.get("head_dim") or c["h"] // c["heads"]
    inter = config["intermediate_size"]
    attn_bias = bool(config.get("attention_bias", False))
    linears = _attention(c["h"], c["heads"], c["kv"], d, attn_bias, attn_bias)
    linears += _glu(c["h"], inter, bias=bool(config.get("mlp_bias", False)))
    tied = config.get("tie_word_embeddings", True)
    return _dense("llama", c, d, inter, linears, 2 * c["h"], tied)


def _qwen2(config: dict) -> Architecture:
    # mlx_lm/models/qwen2.py: q/k/v carry a bias, o does not; head_dim = hidden/heads.
    c = _common(config)
    _require(config, "intermediate_size")
    d = c["h"] // c["heads"]
    inter = config["intermediate_size"]
    linears = _attention(c["h"], c["heads"], c["kv"], d, qkv_bias=True)
    linears += _glu(c["h"], inter)
    tied = config.get("tie_word_embeddings", True)
    return _dense("qwen2", c, d, inter, linears, 2 * c["h"], tied)


def _qwen3(config: dict) -> Architecture:
    # mlx_lm/models/qwen3.py: q_norm and k_norm of head_dim in every block.
    c = _common(config)
    _require(config, "intermediate_size", "head_dim")
    d = config["head_dim"]
    inter = config["intermediate_size"]
    linears = _attention(c["h"], c["heads"], c["kv"], d) + _glu(c["h"], inter)
    tied = bool(config.get("tie_word_embeddings", False))
    return _dense("qwen3", c, d, inter, linears, 2 * c["h"] + 2 * d, tied)


def _gemma(model_type: str, qk_norm: bool) -> Callable[[dict], Architecture]:
    # mlx_lm/models/gemma2.py, gemma3_text.py: four norms per block, the output
    # projection is always the embedding (gemma3_text drops lm_head in sanitize
    # when the checkpoint has none, as every Gemma 3 checkpoint does).
    def build(config: dict) -> Architecture:
        c = _common(config)
        _require(config, "intermediate_size", "head_dim")
        d = config["head_dim"]
        inter = config["intermediate_size"]
        linears = _attention(c["h"], c["heads"], c["kv"], d) + _glu(c["h"], inter)
        norms = 4 * c["h"] + (2 * d if qk_norm else 0)
        return _dense(model_type, c, d, inter, linears, norms, True)

    return build


def _phi3(config: dict) -> Architecture:
    # mlx_lm/models/phi3.py: fused qkv_proj and gate_up_proj, no biases.
    c = _common(config)
    _require(config, "intermediate_size")
    d = c["h"] // c["heads"]
    inter = config["intermediate_size"]
    linears = (
        Linear("self_attn.qkv_proj", c["h"], (c["heads"] + 2 * c["kv"]) * d),
        Linear("self_attn.o_proj", c["heads"] * d, c["h"]),
        Linear("mlp.gate_up_proj", c["h"], 2 * inter),
        Linear("mlp.down_proj", inter, c["h"]),
    )
    tied = bool(config.get("tie_word_embeddings", False))
    return _dense("phi3", c, d, inter, linears, 2 * c["h"], tied)


def _mixtral(config: dict) -> Architecture:
    # mlx_lm/models/mixtral.py: router `gate` plus SwitchGLU experts in every block.
    c = _common(config)
    d = c["h"] // c["heads"]
    inter = config.get("intermediate_size", 14336)
    experts = config.get("num_local_experts", 8)
    linears = _attention(c["h"], c["heads"], c["kv"], d)
    linears += (Linear("block_sparse_moe.gate", c["h"], experts),)
    linears += _glu(c["h"], inter, "block_sparse_moe.switch_mlp.", experts=experts)
    tied = bool(config.get("tie_word_embeddings", False))
    return _dense(
        "mixtral", c, d, inter, linears, 2 * c["h"], tied,
        num_experts=experts,
        experts_per_token=config.get("num_experts_per_tok", 2),
    )


def _qwen3_moe(config: dict) -> Architecture:
    # mlx_lm/models/qwen3_moe.py: a block is sparse unless listed in mlp_only_layers
    # or off the decoder_sparse_step grid; dense blocks use intermediate_size.
    c = _common(config)
    _require(config, "num_experts", "moe_intermediate_size", "intermediate_size")
    d = config.get("head_dim") or c["h"] // c["heads"]
    experts = config["num_experts"]
    step = config.get("decoder_sparse_step", 1)
    dense_only = set(config.get("mlp_only_layers") or [])
    attention = _attention(c["h"], c["heads"], c["kv"], d)
    sparse = attention + (Linear("mlp.gate", c["h"], experts),) + _glu(
        c["h"], config["moe_intermediate_size"], "mlp.switch_mlp.", experts=experts
    )
    dense = attention + _glu(c["h"], config["intermediate_size"])
    norms = 2 * c["h"] + 2 * d
    blocks = tuple(
        Block(
            sparse
            if i not in dense_only and experts > 0 and (i + 1) % step == 0
            else dense,
            norms,
        )
        for i in range(c["L"])
    )
    return Architecture(
        model_type="qwen3_moe",
        hidden_size=c["h"],
        num_heads=c["heads"],
        num_kv_heads=c["kv"],
        head_dim=d,
        intermediate_size=config["moe_intermediate_size"],
        vocab_size=c["V"],
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        blocks=blocks,
        final_norm_params=c["h"],
        num_experts=experts,
        experts_per_token=config.get("num_experts_per_tok", 8),
    )


BUILDERS: dict[str, Callable[[dict], Architecture]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma2": _gemma("gemma2", qk_norm=False),
    "gemma3_text": _gemma("gemma3_text", qk_norm=True),
    "phi3": _phi3,
    "mixtral": _mixtral,
}


def text_config(config: dict) -> dict:
    """The language model's config: multimodal Gemma 3 nests it in `text_config`.

    mlx_lm/models/gemma3.py trains only the language model and sets its
    vocab_size from the outer config (default 262208).
    """
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        inner = dict(config["text_config"])
        inner["model_type"] = "gemma3_text"
        inner["vocab_size"] = config.get("vocab_size", 262208)
        inner.setdefault("num_attention_heads", 8)
        inner.setdefault("num_key_value_heads", 4)
        return inner
    return config


def supported_model_types() -> list[str]:
    return sorted(set(BUILDERS) | set(MODEL_TYPE_ALIASES) | {"gemma3"})


def architecture_from_config(config: dict) -> Architecture:
    """Raises MlxfitError for a model_type mlxfit cannot size."""
    config = text_config(config)
    model_type = config.get("model_type")
    if not model_type:
        raise MlxfitError("config.json has no 'model_type'")
    builder = BUILDERS.get(MODEL_TYPE_ALIASES.get(model_type, model_type))
    if builder is None:
        raise MlxfitError(
            f"model_type {model_type!r} is not supported yet "
            f"(supported: {', '.join(supported_model_types())})"
        )
    try:
        return builder(config)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise MlxfitError(f"config.json for {model_type!r} has unusable values: {e}") from e
