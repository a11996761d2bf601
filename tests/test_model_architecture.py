"""mlxfit's view of a model equals mlx-lm's own model, for every architecture.

Each tiny config (tests/fixtures/tiny_configs.json, shaped like a Hugging Face
config of its family) is built lazily by mlxfit and compared with the model
`mlx_lm.utils.load_model` loads from saved random weights: parameter count and
bytes, dense and 4-bit (group 64), and the trainable adapters of
`linear_to_lora_layers` for all blocks and for 2.
"""

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING, _get_classes, load_model, quantize_model

from mlxfit.errors import MlxfitError
from mlxfit.model import lazy_model, mlx_lm_modules
from mlxfit.model.architecture import architecture_from_config
from mlxfit.model.resolve import _from_config, catalog, catalog_entries

FIXTURES = Path(__file__).parent / "fixtures"
ALL_CONFIGS = json.loads((FIXTURES / "tiny_configs.json").read_text())
UNBUILDABLE = json.loads((FIXTURES / "tiny_configs_unbuildable.json").read_text())
# Families mlx-lm builds but cannot train: mlxfit answers them by the rule of thumb.
NOT_TRAINABLE = {
    "recurrent_gemma": "Model.__init__ never calls nn.Module.__init__, so mlx_lm.lora's model.freeze() fails",
    "prism_hadamard_qwen35": "its HadamardQuantizedLinear layers (embedding included) have no LoRA conversion",
}
CONFIGS = {k: v for k, v in ALL_CONFIGS.items() if k not in NOT_TRAINABLE}


def nbytes(tree) -> int:
    return sum(v.nbytes for _, v in tree_flatten(tree))


def count(tree) -> int:
    return sum(v.size for _, v in tree_flatten(tree))


def save(model, config, folder: Path) -> Path:
    """A checkpoint of this model: its arrays, evaluated, and its config."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def fresh(config):
    """A model built from scratch, never cached, frozen as mlx_lm.lora does."""
    model = lazy_model.build(config)
    model.freeze()
    return model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dense_and_quantized_equal_mlx_lm_load_model(name, tmp_path):
    config = CONFIGS[name]
    mine = fresh(config)
    loaded, _ = load_model(save(mine, config, tmp_path / "dense"), lazy=True)
    assert (count(mine.parameters()), nbytes(mine.parameters())) == (count(loaded.parameters()), nbytes(loaded.parameters()))
    assert architecture_from_config(config).params == count(loaded.parameters())

    # 4-bit, group 64: mlxfit's walk against mlx-lm's quantize_model (convert -q),
    # then a checkpoint of it loaded back by load_model with its quantization block.
    try:
        converted, quantized_config = quantize_model(fresh(config), config, group_size=64, bits=4)
    except (TypeError, ValueError) as e:  # mlx-lm cannot convert this family either
        with pytest.raises(MlxfitError, match="cannot quantize"):
            lazy_model.base_model(config, 4, 64)
        pytest.skip(f"mlx_lm.convert -q fails too: {e}")
    quantized = lazy_model.base_model(config, 4, 64)
    assert nbytes(quantized.parameters()) == nbytes(converted.parameters())
    reloaded, _ = load_model(save(quantized, quantized_config, tmp_path / "q4"), lazy=True)
    assert nbytes(reloaded.parameters()) == nbytes(quantized.parameters())
    assert lazy_model.base_model(quantized_config).parameters().keys() == reloaded.parameters().keys()
    assert nbytes(lazy_model.base_model(quantized_config).parameters()) == nbytes(reloaded.parameters())


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("num_layers", [-1, 2])
def test_adapters_equal_linear_to_lora_layers(name, num_layers, tmp_path):
    config = CONFIGS[name]
    base = lazy_model.base_model(config)
    n = min(num_layers, len(base.layers)) if num_layers > 0 else num_layers
    theirs = fresh(config)
    try:
        linear_to_lora_layers(theirs, n, {"rank": 4, "scale": 20.0, "dropout": 0.0})
    except (TypeError, ValueError) as e:  # mlx-lm refuses LoRA on this family
        with pytest.raises(MlxfitError, match="LoRA"):
            lazy_model.adapter_parameters(base, n, rank=4, dora=False)
        pytest.skip(f"linear_to_lora_layers fails too: {e}")
    mine = lazy_model.adapter_parameters(base, n, rank=4, dora=False)
    expected = tree_flatten(theirs.trainable_parameters())
    assert sorted((v.shape, v.dtype) for _, v in mine) == sorted((v.shape, v.dtype) for _, v in expected)
    assert sum(v.nbytes for _, v in mine) == sum(v.nbytes for _, v in expected)


@pytest.mark.parametrize("name", sorted(NOT_TRAINABLE))
def test_untrainable_families_are_counted_from_the_built_model(name):
    """mlx-lm builds them, so they are counted from its model; what it cannot do with
    them (freeze, LoRA) is each row's to say (tests/test_probe_no_dead_end.py)."""
    info = _from_config(name, "local", ALL_CONFIGS[name])
    assert info.architecture is not None and info.params > 0 and info.rule_only_reason is None
    from mlxfit.estimate.detailed import estimate
    from mlxfit.errors import MlxfitError
    from mlxfit.model.training import TrainingConfig

    with pytest.raises(MlxfitError):
        estimate(info, TrainingConfig(num_layers=-1, quantize=info.quantized, max_seq_length=64))


def test_every_installed_model_type_is_covered_or_explained():
    built = {mlx_lm_modules.module_name(c) for c in ALL_CONFIGS.values()}
    missing = set(mlx_lm_modules.installed_model_types()) - built - set(UNBUILDABLE)
    assert not missing, f"model types with neither a tiny config nor a reason: {sorted(missing)}"


def test_remapping_is_mlx_lm_s_own():
    assert mlx_lm_modules.MODEL_REMAPPING == MODEL_REMAPPING
    assert mlx_lm_modules.MODEL_ARCHITECTURE_REMAPPING == MODEL_ARCHITECTURE_REMAPPING


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_classes_are_the_loaders(name):
    config = CONFIGS[name]
    mine, theirs = mlx_lm_modules.model_classes(config), _get_classes(config)
    assert [c.__qualname__ for c in mine] == [c.__qualname__ for c in theirs]


def test_dora_and_custom_keys_equal_linear_to_lora_layers():
    config = CONFIGS["llama"]
    keys = ["self_attn.q_proj", "self_attn.v_proj"]
    for dora in (False, True):
        mine = lazy_model.adapter_parameters(lazy_model.base_model(config), 1, 8, dora, keys)
        theirs = fresh(config)
        linear_to_lora_layers(theirs, 1, {"rank": 8, "scale": 20.0, "dropout": 0.0, "keys": keys}, use_dora=dora)
        assert sum(v.nbytes for _, v in mine) == nbytes(theirs.trainable_parameters()) > 0


def test_lora_adapters_are_float32_on_any_base():
    config = dict(CONFIGS["llama"], torch_dtype="bfloat16")
    for base in (lazy_model.base_model(config), lazy_model.base_model(config, 4, 64)):
        assert {v.dtype for _, v in lazy_model.adapter_parameters(base, -1, 8, False)} == {mx.float32}


def test_building_allocates_nothing():
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    model = lazy_model.build(catalog()["meta-llama/llama-3.1-8b-instruct"][1])
    assert count(model.parameters()) == 8_030_261_248
    assert mx.get_active_memory() - before < 1 << 20


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


def test_every_catalog_entry_builds_to_its_recorded_size():
    """The catalog's `params` and `moe` (which remedies pick candidates by) are mlx-lm's model's."""
    for entry in catalog_entries():
        arch = architecture_from_config(entry["config"])
        assert (entry["params"], entry["moe"]) == (arch.params, arch.is_moe), entry["id"]
        assert arch.num_layers > 0


def test_parts_add_up():
    arch = architecture_from_config(catalog()["qwen/qwen2.5-7b-instruct"][1])
    parts = arch.part_params()
    assert sum(parts.values()) == arch.params
    assert parts["lm_head"] == parts["embedding"] == 152064 * 3584


def test_block_features_come_from_the_module_tree():
    qwen3 = architecture_from_config(catalog()["qwen/qwen3-0.6b"][1])
    b = qwen3.blocks[0]
    assert (b.heads, b.kv_heads, b.head_dim, b.qkv, b.intermediate, b.qk_norm) == (16, 8, 128, 4096, 3072, True)
    moe = architecture_from_config(catalog()["qwen/qwen3-30b-a3b"][1]).blocks[0]
    assert (moe.experts, moe.experts_per_token, moe.expert_intermediate) == (128, 8, 768)
    gemma3 = architecture_from_config(catalog()["google/gemma-3-1b-it"][1])
    assert [b.kind for b in gemma3.blocks[:6]] == ["sliding"] * 5 + ["attention"]


def test_unmeasured_block_kinds_are_named():
    assert architecture_from_config(catalog()["qwen/qwen3-0.6b"][1]).unmeasured_kinds() == []
    assert architecture_from_config(catalog()["google/gemma-3-1b-it"][1]).unmeasured_kinds() == []


def test_multimodal_config_counts_its_language_model():
    inner = {k: v for k, v in CONFIGS["gemma3_text"].items() if k != "vocab_size"}
    outer = {"model_type": "gemma3", "text_config": inner, "vocab_size": 256}
    model_class, args_class = _get_classes(outer)
    model = model_class(args_class.from_dict(outer))
    model.language_model.sanitize({})
    assert architecture_from_config(outer).params == count(model.parameters())


@pytest.mark.parametrize("name, attn, final", [("gemma2", True, True), ("gemma3n", False, True),
                                                 ("gemma4_text", False, True), ("llama", False, False)])
def test_softcap_is_read_per_place_from_mlx_lm(name, attn, final):
    """gemma2's attention caps its scores with tanh before the softmax; gemma3n and gemma4 cap
    only the logits and call scaled_dot_product_attention unchanged (no extra scores buffer)."""
    import importlib
    import inspect

    arch = architecture_from_config(CONFIGS[name])
    assert (arch.attn_softcap, arch.softcap) == (attn, final)
    if name.startswith("gemma"):
        module = importlib.import_module(f"mlx_lm.models.{name}")
        attention = inspect.getsource(getattr(module, "Attention", None) or module.Gemma3nAttention)
        assert ("tanh" in attention) == attn
        assert ("scaled_dot_product_attention(" in attention) == (not attn)
        assert "tanh" in inspect.getsource(module) and "final_logit_softcapping" in inspect.getsource(module)


def test_unknown_model_type_names_it():
    with pytest.raises(lazy_model.UnknownModelType, match="no model for model_type 'bert'"):
        architecture_from_config({"model_type": "bert", "hidden_size": 8})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 0}, "'hidden_size' must be positive, got 0"),
        ({"vocab_size": -10}, "'vocab_size' must be positive, got -10"),
        ({"num_hidden_layers": "many"}, "'num_hidden_layers' must be an integer, got 'many'"),
        ({"intermediate_size": 12.5}, "'intermediate_size' must be an integer, got 12.5"),
        ({"num_attention_heads": 5, "num_key_value_heads": 2}, r"num_attention_heads \(5\) is not a multiple of num_key_value_heads \(2\)"),
        ({"num_attention_heads": 3, "num_key_value_heads": 1}, r"hidden_size \(64\) is not a multiple of num_attention_heads \(3\)"),
        ({"model_type": 7}, "'model_type' must be a string"),
        ({"num_experts": -1}, "'num_experts' must be positive"),
    ],
)
def test_bad_config_values_name_the_field(change, message):
    config = {k: v for k, v in CONFIGS["llama"].items() if k != "head_dim"}
    with pytest.raises(MlxfitError, match=message):
        architecture_from_config({**config, **change})


def test_model_args_errors_are_one_line():
    config = dict(CONFIGS["llama"], rope_scaling={"rope_type": "nonsense"})
    with pytest.raises(MlxfitError) as e:
        architecture_from_config(config)
    assert "\n" not in str(e.value) and "llama" in str(e.value)


@pytest.mark.parametrize("name", sorted(ALL_CONFIGS))
def test_leaf_modules_are_mlx_nn_s(name):
    """The quantization walk (module_tree.leaf_modules) visits nn.quantize's layers, in its order."""
    import mlx.nn as nn

    from mlxfit.model import module_tree

    model = lazy_model._construct(ALL_CONFIGS[name])
    theirs = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    assert [(p, id(m)) for p, m in module_tree.leaf_modules(model)] == [(p, id(m)) for p, m in theirs]
