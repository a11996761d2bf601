"""Parameter counts equal, to the parameter, mlx-lm's real models."""

import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

from mlxfit.architecture import architecture_from_config, supported_model_types
from mlxfit.errors import MlxfitError
from mlxfit.model import catalog
from tiny_configs import TINY


def mlx_lm_param_count(config):
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    if config["model_type"] in ("gemma3_text", "gemma3"):
        # gemma3_text.Model.sanitize drops lm_head when the checkpoint has none,
        # as every Gemma 3 checkpoint does (tied embeddings).
        getattr(model, "language_model", model).sanitize({})
        params = dict(tree_flatten(model.parameters()))
    return sum(v.size for v in params.values())


@pytest.mark.parametrize("name", sorted(TINY))
def test_count_equals_mlx_lm_model(name):
    config = TINY[name]
    assert architecture_from_config(config).params == mlx_lm_param_count(config)


def test_every_catalog_architecture_has_a_tiny_twin():
    catalog_types = {architecture_from_config(c).model_type for _, c in catalog().values()}
    tiny_types = {architecture_from_config(c).model_type for c in TINY.values()}
    assert catalog_types <= tiny_types


def test_multimodal_gemma3_counts_its_language_model():
    inner = {k: v for k, v in TINY["gemma3_text"].items() if k != "vocab_size"}
    outer = {"model_type": "gemma3", "text_config": inner, "vocab_size": 256}
    assert architecture_from_config(outer).params == mlx_lm_param_count(outer)


@pytest.mark.parametrize(
    "hub_id, params",
    [
        # Published totals (model cards / safetensors metadata).
        ("Qwen/Qwen2.5-7B-Instruct", 7_615_616_512),
        ("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),
        ("meta-llama/Llama-3.2-1B-Instruct", 1_235_814_400),
        ("meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248),
        ("mistralai/Mistral-7B-Instruct-v0.3", 7_248_023_552),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 46_702_792_704),
        ("microsoft/Phi-3-mini-4k-instruct", 3_821_079_552),
    ],
)
def test_catalog_matches_published_totals(hub_id, params):
    _, config = catalog()[hub_id.lower()]
    assert architecture_from_config(config).params == params


def test_parts_add_up():
    arch = architecture_from_config(catalog()["qwen/qwen2.5-7b-instruct"][1])
    parts = arch.part_params()
    assert sum(parts.values()) == arch.params
    assert parts["lm_head"] == parts["embedding"] == 152064 * 3584


def test_unknown_model_type_names_it():
    with pytest.raises(MlxfitError, match="'bert' is not supported"):
        architecture_from_config({"model_type": "bert", "hidden_size": 8})


def test_missing_field_is_named():
    with pytest.raises(MlxfitError, match="missing 'vocab_size'"):
        architecture_from_config({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1})


def test_supported_types_include_aliases():
    assert {"llama", "mistral", "gemma3", "qwen3_moe"} <= set(supported_model_types())
