"""A model's shape as the estimator needs it, read from mlx-lm's own model.

The model is built lazily (mlxfit/model/lazy_model.py); this module walks its module
tree once and keeps, per block, the linear layers (path, sizes, bias, experts),
the attention geometry, the MLP and expert widths and the kind of block (full
or sliding-window softmax attention, multi-head latent attention, linear
attention, or a state-space / convolution mixer). Nothing here is a per-type
table: a new mlx-lm model file is sized the day it is installed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from . import facts, lazy_model
from .lazy_model import text_config
from .module_tree import modules as _modules, walk as _walk
from .mlx_lm_modules import MODEL_REMAPPING, installed_model_types

# Kinds of block the fitted terms were measured on (benchmarks/accuracy.py).
MEASURED_KINDS = ("attention", "mlp")
# Families whose sliding-window attention the accuracy grid measured.
MEASURED_SLIDING_TYPES = ("gemma2", "gemma3", "gemma3_text")
_MIXER_NAMES = ("self_attn", "attn", "attention", "self_attention", "linear_attn", "mixer", "conv", "mamba", "norm_attn_norm")
_OUTPUT_NAMES = ("o_proj", "out_proj", "dense", "wo", "c_proj", "o")
# An MLP's output projection, by name: the only way to tell it from gate and up when
# the MLP is as wide as the model (every one of them hidden x hidden).
_DOWN_NAMES = ("down_proj", "fc2", "w2", "c_proj", "dense_4h_to_h", "wo", "proj_out")
_TOPK_NAMES = ("num_experts_per_tok", "top_k", "n_activated_experts", "moe_topk", "num_selected_experts", "experts_per_token")
_HEAD_NAMES = ("n_heads", "num_heads", "num_attention_heads", "n_head")
_KV_NAMES = ("n_kv_heads", "num_key_value_heads", "num_kv_heads", "n_kv_head")
# Token mixers by class name: linear attention / convolution, and state-space.
# A block with a Conv1d mixes tokens by convolution (lfm2, gated delta, KDA).
_LINEAR_MIXERS = ("gateddelta", "linearattention", "lightning", "deltanet", "deltaattention", "shortconv", "conv1d")
_SSM_MIXERS = ("mamba", "ssm", "rwkv", "rglru", "recurrent")


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
        per_expert = self.in_features * self.out_features + (self.out_features if self.bias else 0)
        return self.experts * per_expert


@dataclass(frozen=True)
class Block:
    linears: tuple[Linear, ...]
    norm_params: int  # every parameter outside the linear layers (norms, convolutions, ...)
    kind: str = "attention"  # attention | sliding | mla | linear | ssm | mlp (no token mixer)
    heads: int = 0  # softmax attention heads (0: no T x T scores)
    kv_heads: int = 0
    head_dim: int = 0
    qkv: int = 0  # width of the attention's input projections
    intermediate: int = 0  # width of the dense MLP (and shared experts)
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    qk_norm: bool = False
    # A gated-delta recurrence (mlx_lm/models/gated_delta.py): value heads, key and
    # value head dims of its per-sequence state (0: no recurrence).
    recurrent: tuple[int, int, int] = (0, 0, 0)
    mixer_inputs: tuple[str, ...] = ()  # paths of the mixer's input projections (q, k, v; in_proj)

    @property
    def params(self) -> int:
        return sum(l.params for l in self.linears) + self.norm_params

    @property
    def is_moe(self) -> bool:
        return self.experts > 1


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    blocks: tuple[Block, ...]
    embedding_params: int
    lm_head_params: int
    other_params: int  # final norm and anything else outside the blocks
    softcap: bool = False  # tanh capping of the logits (final_logit_softcapping: gemma2, gemma3n, gemma4)
    attn_softcap: bool = False  # tanh capping of the attention scores (attn_logit_softcapping: gemma2 only)
    # Figures worked out once from the blocks (mlxfit/estimate/detailed.py); a copy made by
    # dataclasses.replace starts empty.
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def _typical(self, name: str) -> int:
        if ("typical", name) not in self.memo:
            values = [getattr(b, name) for b in self.blocks if getattr(b, name)]
            self.memo["typical", name] = max(set(values), key=values.count) if values else 0
        return self.memo["typical", name]

    @property
    def num_heads(self) -> int:
        return self._typical("heads")

    @property
    def num_kv_heads(self) -> int:
        return self._typical("kv_heads")

    @property
    def head_dim(self) -> int:
        return self._typical("head_dim")

    @property
    def intermediate_size(self) -> int:
        return self._typical("expert_intermediate") or self._typical("intermediate")

    @property
    def num_experts(self) -> int:
        return max((b.experts for b in self.blocks), default=0)

    @property
    def experts_per_token(self) -> int:
        return max((b.experts_per_token for b in self.blocks), default=0)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def kinds(self) -> list[str]:
        if "kinds" not in self.memo:
            self.memo["kinds"] = sorted({b.kind for b in self.blocks})
        return list(self.memo["kinds"])

    def unmeasured_kinds(self) -> list[str]:
        """Block kinds the fitted terms were never measured on, for this family."""
        measured = set(MEASURED_KINDS)
        if self.model_type in MEASURED_SLIDING_TYPES:
            measured.add("sliding")
        return [k for k in self.kinds if k not in measured]

    @property
    def params(self) -> int:
        return sum(self.part_params().values())

    @property
    def active_params(self) -> int:
        """Parameters a token runs through: each MoE block's k of E experts."""
        inactive = 0
        for b in self.blocks:
            if b.is_moe and b.experts_per_token:
                experts = sum(l.params for l in b.linears if l.experts == b.experts)
                inactive += experts * (b.experts - b.experts_per_token) // b.experts
        return self.params - inactive

    def describe(self) -> str:
        """A few words: depth, the kinds of block where not all are full attention, experts."""
        words = {"attention": "attn", "sliding": "sliding", "mla": "MLA", "linear": "linear/conv",
                 "ssm": "SSM", "mlp": "MLP-only"}
        parts = [f"{self.num_layers} blocks"]
        if self.kinds != ["attention"]:
            counts = {k: sum(b.kind == k for b in self.blocks) for k in self.kinds}
            parts.append(" + ".join(f"{n} {words.get(k, k)}" for k, n in counts.items()))
        if self.is_moe:
            parts.append(f"MoE {self.num_experts}×top-{self.experts_per_token}")
        return ", ".join(parts)

    def part_params(self) -> dict[str, int]:
        """Parameter counts by named part, in the spirit of nanoGPT's sizing."""
        attention = mlp = norms = 0
        for block in self.blocks:
            for linear in block.linears:
                if linear.path.split(".")[0] in _MIXER_NAMES:
                    attention += linear.params
                else:
                    mlp += linear.params
            norms += block.norm_params
        return {
            "embedding": self.embedding_params,
            "attention": attention,
            "mlp": mlp,
            "norms": norms + self.other_params,
            "lm_head": self.lm_head_params,
        }


def _dims(module: nn.Module) -> tuple[int, int, int]:
    """(in, out, experts) of a Linear, QuantizedLinear, (Quantized)SwitchLinear or Embedding
    (an embedding's in is its width, its out the vocabulary), quantized weights unpacked."""
    w = module["weight"]
    bits = getattr(module, "bits", None)
    if w.ndim == 3:
        experts, out, packed = w.shape
    else:
        experts, (out, packed) = 1, w.shape
    n_in = packed * 32 // bits if bits else packed
    return n_in, out, experts


def _packed(module: nn.Module, kind: str) -> bool:
    """A model file's own quantized layer (prism_hadamard_qwen35's HadamardQuantizedLinear
    and ...Embedding): a packed weight with its bits, by class name."""
    return kind in type(module).__name__ and isinstance(getattr(module, "bits", None), int) and "weight" in module


def _is_linear(module: nn.Module) -> bool:
    name = type(module).__name__
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)) or name in ("SwitchLinear", "QuantizedSwitchLinear"):
        return True
    return _packed(module, "Linear") and not _packed(module, "Embedding")


def _is_embedding(module: nn.Module) -> bool:
    return isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)) or _packed(module, "Embedding")


def _int_attr(module: nn.Module, names) -> int:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _attention(modules) -> tuple[str, nn.Module] | tuple[None, None]:
    """The block's softmax attention, shallowest first (the first of a list)."""
    for path, module in modules:
        name = type(module).__name__.lower()
        if any(k in name for k in _LINEAR_MIXERS + _SSM_MIXERS):
            continue
        if "attention" in name or name.endswith(("mha", "mla")):
            return path, module
    return None, None


def _mixer_path(modules) -> str | None:
    """Where the block mixes tokens: its attention, else its linear-attention,
    convolution or state-space module (a Conv1d's parent)."""
    path, _ = _attention(modules)
    if path is not None:
        return path
    for path, module in modules:
        name = type(module).__name__.lower()
        if any(k in name for k in _LINEAR_MIXERS + _SSM_MIXERS):
            return path.rpartition(".")[0] or path if name == "conv1d" else path
    return None


def _kind(block: nn.Module, modules, index: int, config: dict) -> str:
    classes = " ".join(type(m).__name__.lower() for _, m in modules)
    if any(k in classes for k in _SSM_MIXERS):
        return "ssm"
    if any(path == "linear_attn" for path, _ in modules) or any(k in classes for k in _LINEAR_MIXERS):
        return "linear"
    _, attention = _attention(modules)
    if attention is None:
        return "mlp"
    if (type(attention).__name__.lower().endswith("mla") or "kv_a_proj_with_mqa" in dict(_modules(attention))
            or hasattr(attention, "kv_lora_rank")):
        return "mla"
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and index < len(layer_types) and "sliding" in str(layer_types[index]):
        return "sliding"
    for m in (block, attention):
        if any(getattr(m, a, False) is True for a in ("is_sliding", "use_sliding", "is_local")):
            return "sliding"
    return "attention"


def _block(block: nn.Module, index: int, config: dict, hidden: int, tree: list) -> Block:
    """`tree`: module_tree.walk(block)."""
    modules = sorted(((k, m) for k, m in tree if k and isinstance(m, nn.Module)), key=lambda km: km[0].count("."))
    linears = []
    for path, module in modules:
        if _is_linear(module):
            n_in, n_out, experts = _dims(module)
            linears.append(Linear(path, n_in, n_out, "bias" in module, experts))
    arrays = [(k, a) for k, a in tree if isinstance(a, mx.array)]
    linear_prefixes = tuple(f"{l.path}." for l in linears)
    inside = sum(a.size for k, a in arrays if k.startswith(linear_prefixes))
    total = sum(a.size for _, a in arrays)
    kind = _kind(block, modules, index, config)
    mixer = _mixer_path(modules)
    prefix = f"{mixer}." if mixer else None
    in_mixer = [l for l in linears if prefix and l.path.startswith(prefix)]
    # The mixer's input projections (q, k, v; a linear attention's or SSM's in_proj).
    inputs = [l for l in in_mixer if l.in_features == hidden and l.path.split(".")[-1] not in _OUTPUT_NAMES]
    qkv = sum(l.out_features for l in inputs)
    heads = kv = head_dim = 0
    qk_norm = False
    if kind in ("attention", "sliding", "mla"):
        _, attention = _attention(modules)
        heads = _int_attr(attention, _HEAD_NAMES) or int(config.get("num_attention_heads") or 0)
        kv = _int_attr(attention, _KV_NAMES) or int(config.get("num_key_value_heads") or heads)
        q_out = next((l.out_features for l in inputs if l.path.endswith("q_proj")), 0)
        head_dim = (_int_attr(attention, ("head_dim", "head_size")) or (q_out // heads if q_out and heads else 0)
                    or int(config.get("head_dim") or 0) or (hidden // heads if heads else 0))
        qk_norm = "q_norm" in attention and "k_norm" in attention
    experts = max((l.experts for l in linears), default=1)
    expert_down = [l for l in linears if l.experts > 1 and l.out_features == hidden]
    dense_down = [l for l in linears if l.experts == 1 and l.out_features == hidden and l not in in_mixer
                  and (l.in_features != hidden or l.path.split(".")[-1] in _DOWN_NAMES)]
    recurrent = next(((h, k, v) for _, m in modules if (h := _int_attr(m, ("num_v_heads",)))
                      and (k := _int_attr(m, ("head_k_dim",))) and (v := _int_attr(m, ("head_v_dim",)))), (0, 0, 0))
    topk = 0
    if experts > 1:
        topk = next((v for _, m in [("", block)] + modules if (v := _int_attr(m, _TOPK_NAMES))), 0)
        topk = topk or int(text_config(config).get("num_experts_per_tok") or 2)
    return Block(
        linears=tuple(linears),
        # Non-linear parameters (norms, convolutions, biases of custom layers);
        # `inside` counts what the linears hold besides weight and bias (scales).
        norm_params=total - inside,
        kind=kind,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        qkv=qkv,
        intermediate=sum(l.in_features for l in dense_down),
        experts=experts if experts > 1 else 0,
        experts_per_token=topk,
        expert_intermediate=max((l.in_features for l in expert_down), default=0),
        qk_norm=qk_norm,
        mixer_inputs=tuple(l.path for l in inputs),
        recurrent=recurrent,
    )


_EMBEDDING_NAMES = ("embed_tokens", "wte", "tok_embeddings")


def _token_embedding(embeddings) -> tuple[str, nn.Module] | None:
    """The token embedding: by its usual name, else the one with most rows."""
    named = [e for e in embeddings if e[0].split(".")[-1] in _EMBEDDING_NAMES]
    pool = named or embeddings
    return max(pool, key=lambda e: e[1]["weight"].shape[0]) if pool else None


def from_model(model: nn.Module, config: dict) -> Architecture:
    """The Architecture of a built model that will not change any more (its blocks'
    walks are kept on it for sizing: mlxfit/model/lazy_model.py)."""
    inner = text_config(config)
    layers = model.layers
    tree = _walk(model, skip={id(b) for b in layers})  # everything outside the blocks
    embeddings = [(k, m) for k, m in tree if isinstance(m, nn.Module) and _is_embedding(m)]
    token = _token_embedding(embeddings)
    if token is None:
        raise lazy_model.NotSizable(f"mlx-lm's {config.get('model_type')!r} model has no token embedding")
    hidden, vocab, _ = _dims(token[1])
    heads = [(k, m) for k, m in tree if isinstance(m, nn.Module) and _is_linear(m) and k.split(".")[-1] == "lm_head"]
    blocks = tuple(_block(layer, i, inner, hidden, lazy_model.block_tree(model, i)) for i, layer in enumerate(layers))
    outside = {k: v for k, v in tree if isinstance(v, mx.array)}
    # Embeddings and heads count their weights' elements; quantized scales and
    # biases are storage, not parameters. A head's own bias is a parameter.
    counted = {f"{k}.{name}" for k, _ in embeddings for name in ("weight", "scales", "biases")}
    counted |= {f"{k}.{name}" for k, _ in heads for name in ("weight", "scales", "biases")}
    return Architecture(
        model_type=inner.get("model_type") or config["model_type"],
        hidden_size=hidden,
        vocab_size=vocab,
        tied_embeddings=not heads,
        blocks=blocks,
        embedding_params=sum(math.prod(_dims(m)) for _, m in embeddings),
        lm_head_params=sum(math.prod(_dims(m)) for _, m in heads),
        other_params=sum(v.size for k, v in outside.items() if k not in counted),
        softcap=_softcap(model, inner, "final_logit_softcapping"),
        attn_softcap=_softcap(model, inner, "attn_logit_softcapping"),
    )


def _softcap(model: nn.Module, config: dict, name: str) -> bool:
    """tanh capping by the model's own arguments: `final_logit_softcapping` caps the logits,
    `attn_logit_softcapping` the attention scores (gemma2's manual attention; gemma3n and
    gemma4 cap only their logits and run mx.fast.scaled_dot_product_attention unchanged)."""
    args = getattr(model, "args", None) or getattr(getattr(model, "language_model", None), "args", None)
    return bool(getattr(args, name, None) or config.get(name))


def supported_model_types() -> list[str]:
    return sorted(set(installed_model_types()) | set(MODEL_REMAPPING))


def architecture_from_config(config: dict) -> Architecture:
    """Raises MlxfitError (lazy_model.UnknownModelType for a model_type the
    installed mlx-lm has no model for)."""
    lazy_model.check_config(config)
    key = lazy_model.config_key(config)
    return facts.recall(key, "architecture", lambda: from_model(lazy_model.built_for_key(key), config))
