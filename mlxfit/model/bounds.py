"""Sizes no real model comes near, refused before a model is built.

A model is built lazily (mlxfit/model/lazy_model.py): its arrays cost nothing, but each
module does, so a config of 100,000 layers would take minutes and gigabytes before
anything is printed. Each bound sits several times past the largest public model, so a
value over it is a mistake (a typo, a field of another meaning), not a model to size.
"""

from __future__ import annotations

from ..errors import MlxfitError

# (config fields, the most mlxfit sizes, the largest public models for comparison)
LIMITS = (
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers"), 1_024, "the deepest have about 130 layers"),
    (("hidden_size", "n_embd", "d_model"), 131_072, "the widest have a hidden size of about 18,000"),
    (("intermediate_size", "moe_intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), 1_048_576,
     "the widest MLPs have about 74,000 units"),
    (("vocab_size",), 16_777_216, "the largest vocabularies have about 262,000 tokens"),
    (("num_attention_heads", "num_key_value_heads", "n_head", "n_heads", "num_heads"), 8_192,
     "the most heads are about 128"),
    (("head_dim",), 8_192, "heads are at most about 256 wide"),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "n_shared_experts",
      "num_experts_per_tok"), 4_096, "the most experts are about 512"),
    (("max_position_embeddings",), 1 << 30, "the longest contexts are about 10 million tokens"),
)
_LIMIT = {name: (limit, real) for names, limit, real in LIMITS for name in names}
LAYERS, EXPERTS = LIMITS[0][0], LIMITS[6][0]
# Layers × experts: a model builds its experts once per layer. Most stack them in one
# module (SwitchGLU), but DBRX builds each expert as a module of its own (mlx_lm/models/
# dbrx.py; tests/test_cli.py pins it), about a millisecond each.
PRODUCTS = (
    (LAYERS, EXPERTS, 65_536, "the most have about 25,000: 48 layers × 512 experts"),
    (("n_layers",), ("ffn_config.moe_num_experts",), 2_048,
     "DBRX has 40 layers × 16 experts, and builds each expert as a module of its own"),
)


def check_bounds(config: dict) -> None:
    """MlxfitError naming the first size in `config` (at any depth: text_config,
    ffn_config, ...) past its bound, with the bound and why."""
    sizes = list(_sizes(config, ""))
    for where, value in sizes:
        limit, real = _LIMIT[where.rsplit(".", 1)[-1]]
        if value > limit:
            raise MlxfitError(
                f"config.json field '{where}' is {value:,}, over the {limit:,} mlxfit sizes: no real model comes "
                f"near ({real}), so it is most likely a mistake"
            )
    for first, second, limit, real in PRODUCTS:
        a = max(((v, w) for w, v in sizes if _named(w, first)), default=None)
        b = max(((v, w) for w, v in sizes if _named(w, second)), default=None)
        if a and b and a[0] * b[0] > limit:
            raise MlxfitError(
                f"config.json: {a[1]} × {b[1]} is {a[0]:,} × {b[0]:,} = {a[0] * b[0]:,}, over the {limit:,} "
                f"mlxfit sizes: no real model comes near ({real}), so it is most likely a mistake"
            )


def _named(where: str, names) -> bool:
    """Is the dotted field `where` one of `names` (a bare name at any depth, or a dotted path)?"""
    return where in names or where.rsplit(".", 1)[-1] in names and not any("." in n for n in names)


def _sizes(config: dict, prefix: str):
    """(dotted name, number) of every bounded field, per-layer lists included."""
    for name, value in config.items():
        where = f"{prefix}{name}"
        if isinstance(value, dict):
            yield from _sizes(value, where + ".")
        elif name in _LIMIT:
            for v in value if isinstance(value, list) else (value,):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    yield where, v
