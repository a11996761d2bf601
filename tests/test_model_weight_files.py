"""The dtype and bits of a model come from its weight files' headers, as mlx-lm loads them.

Each folder is written with mlx (mx.save_safetensors) and mlx-lm's own quantize_model /
AWQ config writer; the bytes mlxfit counts are checked against the bytes the files
hold and the bytes of the model mlx_lm.utils.load_model loads from them.
"""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, quantize_model

from mlxfit.cli.main import cli
from mlxfit.errors import MlxfitError
from mlxfit.estimate.detailed import dtype_bytes, estimate, weight_bytes
from mlxfit.estimate.reference import reference_bytes
from mlxfit.measure.build import build, random_model
from mlxfit.model import lazy_model, resolve, weight_files
from mlxfit.model.preference import PreferenceRun
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig
from tiny_configs import TINY

# Untied, so the head is a layer of its own (a UD release's 8-bit head).
CONFIG = dict(TINY["llama"], hidden_size=128, intermediate_size=256, vocab_size=512, tie_word_embeddings=False)


def save(folder: Path, model, config: dict) -> Path:
    folder.mkdir(parents=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def file_bytes(folder: Path) -> int:
    """What the files hold, read back by mlx itself."""
    return sum(v.nbytes for f in folder.glob("model*.safetensors") for v in mx.load(str(f)).values())


def loaded_bytes(folder: Path) -> int:
    model, _ = load_model(folder, lazy=True)
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def config_only(folder: Path, tmp_path: Path) -> Path:
    bare = tmp_path / f"{folder.name}-config-only"
    bare.mkdir()
    shutil.copy(folder / "config.json", bare / "config.json")
    return bare


@pytest.fixture
def float32_folder(tmp_path):
    """Float32 weights and a config.json with no torch_dtype (as mlx_lm convert leaves one)."""
    assert "torch_dtype" not in CONFIG and "dtype" not in CONFIG
    return save(tmp_path / "fp32", random_model(CONFIG, mx.float32), CONFIG)


def test_a_config_without_dtype_is_sized_in_the_files_float32(float32_folder, tmp_path):
    model = from_folder(float32_folder)
    assert (model.dtype, model.dtype_source) == ("float32", "weight files")
    assert weight_bytes(model, TrainingConfig(num_layers=-1)) == file_bytes(float32_folder) == loaded_bytes(float32_folder)
    assert dtype_bytes(model) == 4  # activations in the weights' dtype, as mlx-lm computes
    # The config alone is sized in bfloat16 and says it assumed so: half the weights.
    bare = from_folder(config_only(float32_folder, tmp_path))
    assert (bare.dtype, bare.dtype_source) == ("bfloat16", "unstated")
    assert weight_bytes(bare, TrainingConfig(num_layers=-1)) * 2 == weight_bytes(model, TrainingConfig(num_layers=-1))


def test_the_reference_copy_and_full_rows_count_the_files_bytes(float32_folder):
    model = from_folder(float32_folder)
    run = PreferenceRun(mode="dpo", training=TrainingConfig(num_layers=-1))
    assert reference_bytes(model, run) == file_bytes(float32_folder)
    full = estimate(model, TrainingConfig(fine_tune_type="full", num_layers=-1))
    assert full.parts["weights (frozen)"] + full.parts["weights (trainable)"] == file_bytes(float32_folder)


def test_qlora_quantizes_the_files_float32_as_convert_does(float32_folder):
    model = from_folder(float32_folder)
    loaded, config = load_model(float32_folder, lazy=True)
    converted, _ = quantize_model(loaded, config, group_size=64, bits=4)
    theirs = sum(v.nbytes for _, v in tree_flatten(converted.parameters()))
    assert weight_bytes(model, TrainingConfig(num_layers=-1, quantize=True)) == theirs  # float32 scales and biases


def test_the_measurement_builds_the_files_dtype(float32_folder):
    """--measure: the child loads the files, or builds random weights from the config
    resolve hands it, which now states the files' dtype."""
    model = from_folder(float32_folder)
    training = TrainingConfig(num_layers=1)
    for folder in (float32_folder, None):
        built = build(model.config, folder, training)
        assert {p.dtype for _, p in tree_flatten(built.parameters())} == {mx.float32}


def test_probe_says_where_the_dtype_came_from(float32_folder, tmp_path, platform):
    from conftest import LINUX_CPU

    platform(LINUX_CPU)
    runner = CliRunner()
    data = json.loads(runner.invoke(cli, ["probe", "--model", str(float32_folder), "--num-layers", "2", "--json"]).output)
    assert data["model"]["dtype"] == "float32" and data["model"]["dtype_source"] == "weight files"
    assert data["model"]["weight_files"] == {"from": "folder", "tensors": len(mx.load(str(float32_folder / "model.safetensors"))),
                                             "bytes": file_bytes(float32_folder)}
    text = runner.invoke(cli, ["probe", "--model", str(float32_folder), "--num-layers", "2"], env={"COLUMNS": "200"}).output
    assert "float32 (from the weight files)" in text
    bare = runner.invoke(cli, ["probe", "--model", str(config_only(float32_folder, tmp_path)), "--num-layers", "2"], env={"COLUMNS": "200"}).output
    assert "bfloat16 (assumed: the config states no dtype)" in bare


# --- quantized conversions with a mix of bits


def test_mlx_lm_writes_per_layer_bits_into_quantization():
    """The format read back: quantize_model writes a predicate's dict under the layer's
    path; mlx_lm.quant.awq.update_config writes every leaf, False where unquantized;
    load_model's class_predicate returns config["quantization"][path] first."""
    import inspect

    from mlx_lm import utils
    from mlx_lm.quant.awq import update_config

    eight = {"group_size": 64, "bits": 8}
    _, config = quantize_model(lazy_model.build(CONFIG), dict(CONFIG), 64, 4,
                               quant_predicate=lambda p, m: dict(eight) if p == "model.layers.0.mlp.down_proj" else True)
    assert config["quantization"]["model.layers.0.mlp.down_proj"] == eight
    assert "model.layers.1.mlp.down_proj" not in config["quantization"]
    model = lazy_model.build(CONFIG)
    model.update_modules({"lm_head": model.lm_head.to_quantized(group_size=64, bits=8)})
    written = update_config(model, {})["quantization"]
    assert written["lm_head"] == eight and written["model.layers.0.mlp.down_proj"] is False
    assert 'if p in config["quantization"]:\n                return config["quantization"][p]' in inspect.getsource(utils.load_model)


def _mixed(path, module):
    """Some layers 8-bit, some left unquantized, the rest 4-bit."""
    if path.startswith("model.layers.0.mlp"):
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    if path == "model.layers.1.self_attn.o_proj":
        return False
    return True


def _ud(path, module):
    """An Unsloth "UD" release's mix: 8-bit embeddings and head, 4-bit elsewhere."""
    if path in ("model.embed_tokens", "lm_head"):
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    return True


def converted(tmp_path, name, predicate, config_names_layers: bool) -> Path:
    model, config = quantize_model(random_model(CONFIG), dict(CONFIG), 64, 4, quant_predicate=predicate)
    if not config_names_layers:  # a converter that writes only the top-level bits
        config["quantization"] = config["quantization_config"] = {"group_size": 64, "bits": 4}
    return save(tmp_path / name, model, config)


@pytest.mark.parametrize("predicate", [_mixed, _ud], ids=["per-layer", "ud"])
@pytest.mark.parametrize("config_names_layers", [True, False], ids=["config-names-layers", "top-level-only"])
def test_mixed_bits_count_the_files_bytes(tmp_path, predicate, config_names_layers):
    folder = converted(tmp_path, "q", predicate, config_names_layers)
    model = from_folder(folder)
    assert model.quantized and model.bits_source == "weight files" and model.bits_mix == (4, 8)
    assert weight_bytes(model, TrainingConfig(num_layers=-1)) == file_bytes(folder) == loaded_bytes(folder)
    # A DPO reference copy is the model loaded again as stored.
    assert reference_bytes(model, PreferenceRun(mode="dpo", training=TrainingConfig(num_layers=-1))) == file_bytes(folder)
    # --measure's random weights from the config resolve hands on hold the same arrays.
    built = random_model(model.config)
    mx.eval(built.parameters())
    assert sum(v.nbytes for _, v in tree_flatten(built.parameters())) == file_bytes(folder)
    bare = from_folder(config_only(folder, tmp_path))
    assert bare.bits_source == "config"
    if not config_names_layers:  # the config alone takes every layer for 4-bit
        assert weight_bytes(bare, TrainingConfig(num_layers=-1)) < file_bytes(folder)


def test_a_standard_conversion_keeps_its_config(tmp_path):
    """Files that agree with the config change nothing (the same key, the same cached answers)."""
    folder = converted(tmp_path, "q4", lambda p, m: True, True)
    config = json.loads((folder / "config.json").read_text())
    model = from_folder(folder)
    assert model.config == config and model.bits_mix == () and model.bits_source == "weight files"
    assert weight_bytes(model, TrainingConfig(num_layers=-1)) == file_bytes(folder)


# --- reading the headers


def test_headers_are_read_without_the_weights(float32_folder):
    files = weight_files.read_folder(float32_folder)
    on_disk = mx.load(str(float32_folder / "model.safetensors"))
    assert {k: (t.dtype, t.shape) for k, t in files.tensors.items()} == {k: ("F32", tuple(v.shape)) for k, v in on_disk.items()}
    assert files.nbytes == file_bytes(float32_folder) and files.float_dtype == "float32"


def test_a_weight_file_that_is_not_safetensors_is_one_line(tmp_path):
    folder = tmp_path / "lfs"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    with pytest.raises(MlxfitError, match="is not a safetensors file"):
        from_folder(folder)


# --- a Hugging Face id: the headers from the hub, kept in mlxfit's cache


def _hub_metadata(folder: Path):
    """What huggingface_hub.get_safetensors_metadata returns for these files."""
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

    header = weight_files.read_header(folder / "model.safetensors")
    offset, tensors = 0, {}
    for name, t in header.items():
        tensors[name] = TensorInfo(dtype=t.dtype, shape=list(t.shape), data_offsets=(offset, offset + t.nbytes))
        offset += t.nbytes
    files = {"model.safetensors": SafetensorsFileMetadata(metadata={}, tensors=tensors)}
    return SafetensorsRepoMetadata(metadata=None, sharded=False, weight_map=dict.fromkeys(tensors, "model.safetensors"),
                                   files_metadata=files)


@pytest.fixture
def hub_config(float32_folder, tmp_path):
    """config.json as the Hugging Face cache holds it (snapshots/<commit>/config.json)."""
    snapshot = tmp_path / "hf-cache" / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(float32_folder / "config.json", snapshot / "config.json")
    return snapshot / "config.json"


def test_a_hub_model_reads_the_headers_once_then_from_the_cache(float32_folder, hub_config, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    asked = []

    def get_safetensors_metadata(repo_id, revision=None, **kwargs):
        asked.append((repo_id, revision))
        return _hub_metadata(float32_folder)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(resolve, "_reachable", lambda endpoint, timeout=None: True)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", get_safetensors_metadata)
    model = resolve._from_hub_config("someone/tiny-fp32", hub_config)
    assert asked == [("someone/tiny-fp32", "b" * 40)]
    assert (model.dtype, model.dtype_source, model.weight_files["from"]) == ("float32", "weight files", "hub")
    assert weight_bytes(model, TrainingConfig(num_layers=-1)) == file_bytes(float32_folder)
    # Offline now: the cached headers answer.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    again = resolve._from_hub_config("someone/tiny-fp32", hub_config)
    assert len(asked) == 1 and again.dtype == "float32" and again.config == model.config


def test_a_hub_model_offline_falls_back_to_the_config_and_says_so(hub_config, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model = resolve._from_hub_config("someone/tiny-fp32", hub_config)
    assert (model.dtype, model.dtype_source) == ("bfloat16", "unstated")
    assert "offline" in model.weight_files["unread"]


def test_an_unreachable_hub_falls_back_to_the_config(hub_config, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    def refused(*args, **kwargs):
        raise ConnectionError("no route")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(resolve, "_reachable", lambda endpoint, timeout=None: True)
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", refused)
    config = dict(CONFIG, torch_dtype="float16")
    hub_config.write_text(json.dumps(config))
    model = resolve._from_hub_config("someone/tiny", hub_config)
    assert (model.dtype, model.dtype_source) == ("float16", "config")
    assert model.weight_files == {"unread": "the weight files' headers could not be fetched (ConnectionError)"}
    assert not weight_files.cache_path("someone/tiny", "b" * 40).exists()
