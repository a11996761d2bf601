"""Every model type answers with exit 0: a method mlx-lm cannot run says why in its
row and the other rows stand; a model mlx-lm cannot build gets the rule of thumb,
said as such; counts come from the built model whenever it builds."""

import json
from pathlib import Path

from click.testing import CliRunner
from mlx.utils import tree_flatten

from mlxfit.cli.main import cli
from mlxfit.model import lazy_model

ZOO = json.loads((Path(__file__).parent / "fixtures" / "tiny_configs.json").read_text())
# allenai/OLMo-1B's own config (hf_olmo): mlx-lm's olmo.py exits at import without ai2-olmo.
OLMO = {"model_type": "olmo", "d_model": 64, "n_layers": 2, "n_heads": 4, "mlp_ratio": 4, "vocab_size": 256,
        "embedding_size": 256, "weight_tying": False}
SMALL = ("--memory", "16GB", "--max-seq-length", "256", "--num-layers", "-1")


def folder(tmp_path: Path, config: dict) -> str:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "model")


def probe(path: str, *args, json_out=True):
    result = CliRunner().invoke(cli, ["probe", "--model", path, *SMALL, *args, *(["--json"] if json_out else [])],
                                catch_exceptions=False, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return json.loads(result.output) if json_out else " ".join(result.output.split())  # lines unwrapped


def rows(data) -> dict:
    return {e["method"]: e for e in data["estimates"]}


def built_count(config: dict) -> int:
    model = lazy_model.build(config)
    return sum(v.size for _, v in tree_flatten(model.parameters()))


def test_a_model_mlx_lm_cannot_import_gets_the_rule_of_thumb_said_as_such(tmp_path):
    path = folder(tmp_path, OLMO)
    data = probe(path)
    assert data["basis"] == "rule"
    reason = data["model"]["rule_only_reason"]
    assert "ai2-olmo" in reason and "rule of thumb only" in reason
    assert data["model"]["params"] > 0
    text = probe(path, json_out=False)
    assert "rule of thumb" in text and "Traceback" not in text


def test_a_method_mlx_lm_cannot_do_says_why_and_the_other_rows_stand(tmp_path):
    data = probe(folder(tmp_path, ZOO["afm7"]))
    by = rows(data)
    assert "quantize" in by["qlora"]["cannot"] and by["qlora"]["verdict"] == "mlx-lm cannot"
    assert not by["qlora"]["fits"] and "breakdown" not in by["qlora"]
    for method in ("lora", "full"):
        assert "cannot" not in by[method] and by[method]["basis"] != "rule" and by[method]["breakdown"]
    (tmp_path / "again").mkdir()
    text = probe(folder(tmp_path / "again", ZOO["afm7"]), json_out=False)
    assert "mlx-lm cannot quantize" in text and "the other rows stand" in text


def test_a_per_layer_intermediate_size_is_read_as_the_model_class_reads_it(tmp_path):
    config = json.loads(json.dumps(ZOO["gemma3n"]))
    layers = config["text_config"]["num_hidden_layers"]
    single = probe(folder(tmp_path, config))
    config["text_config"]["intermediate_size"] = [config["text_config"]["intermediate_size"]] * layers
    (tmp_path / "list").mkdir()
    listed = probe(folder(tmp_path / "list", config))
    assert listed["basis"] == "detailed"
    assert listed["model"]["params"] == single["model"]["params"] == built_count(config)
    config["text_config"]["intermediate_size"] = [128, "wide"] + [128] * (layers - 2)
    (tmp_path / "bad").mkdir()
    result = CliRunner().invoke(cli, ["probe", "--model", folder(tmp_path / "bad", config), *SMALL])
    assert result.exit_code != 0 and "intermediate_size" in result.output and "Traceback" not in result.output


def test_a_model_files_own_quantized_layers_are_sized(tmp_path):
    """prism_hadamard_qwen35 packs its embedding and some linears in its own classes:
    the model is sized from them, and LoRA (mlx-lm cannot put it on those layers) says so."""
    config = ZOO["prism_hadamard_qwen35"]
    data = probe(folder(tmp_path, config))
    by = rows(data)
    assert data["model"]["params"] > 0 and data["basis"] == "detailed"
    assert "Can't convert layer of type HadamardQuantizedLinear" in by["qlora"]["cannot"]
    # Its packed layers stay quantized whatever the config says: full fine-tuning cannot run either.
    assert "no gradient wrt the quantized weights" in by["full"]["cannot"]
    (tmp_path / "last").mkdir()
    last = probe(folder(tmp_path / "last", config), "--num-layers", "1")
    assert "cannot" not in rows(last)["qlora"]  # the last block's layers are plain ones


def test_a_model_that_builds_is_counted_from_the_built_model_even_if_mlx_lm_cannot_train_it(tmp_path):
    config = ZOO["recurrent_gemma"]
    data = probe(folder(tmp_path, config))
    assert data["model"]["params"] == built_count(config)
    assert data["model"]["rule_only_reason"] is None
    assert all("cannot train" in e["cannot"] for e in data["estimates"])
    (tmp_path / "text").mkdir()
    text = probe(folder(tmp_path / "text", config), json_out=False)
    assert "cannot train it by any method" in text


def test_full_fine_tuning_of_a_quantized_base_is_what_mlx_lm_cannot_run(tmp_path):
    """mlx_lm/lora.py's full fine-tuning (freeze, then unfreeze the last blocks) on a
    quantized model, run for real on a tiny one: MLX has no gradient for the
    quantized weights. So probe sizes full fine-tuning on the original weights and says so."""
    import mlx.core as mx
    import mlx.nn as nn
    import pytest

    from mlxfit.estimate.sizing import FULL_ON_QUANTIZED

    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
              "tie_word_embeddings": True, "torch_dtype": "float32"}
    model = lazy_model.build(config)
    nn.quantize(model, group_size=64, bits=4)
    model.freeze()
    for layer in model.layers[-1:]:
        layer.unfreeze()
    loss = nn.value_and_grad(model, lambda m, x: m(x).astype(mx.float32).sum())
    with pytest.raises(RuntimeError, match="no gradient wrt the quantized weights") as raised:
        mx.eval(loss(model, mx.array([[1, 2, 3]])))
    assert "no gradient wrt the quantized weights" in FULL_ON_QUANTIZED and str(raised.value).rstrip(".") in FULL_ON_QUANTIZED

    quantized = {**config, "quantization": {"bits": 4, "group_size": 64}}
    data = probe(folder(tmp_path, quantized))
    full = rows(data)["full"]
    assert full["sized_on"].startswith("the original float32 weights, not the 4-bit base")
    (tmp_path / "plain").mkdir()
    plain = rows(probe(folder(tmp_path / "plain", config)))["full"]
    assert full["predicted_peak_bytes"] == plain["predicted_peak_bytes"] and "sized_on" not in plain
    (tmp_path / "text").mkdir()
    text = probe(folder(tmp_path / "text", quantized), json_out=False)
    assert "full ¹" in text and "¹ full is sized on the original float32 weights" in text
