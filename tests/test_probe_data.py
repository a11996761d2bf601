"""`probe -c lora.yaml --data DIR`: mlx-lm's config and the user's own data drive the plan."""

import json
import shutil

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.detailed import estimate
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU
from tiny_configs import TINY


@pytest.fixture
def model_with_tokenizer(tmp_path, tokenizer_folder):
    folder = tmp_path / "model"
    shutil.copytree(tokenizer_folder, folder)
    (folder / "config.json").write_text(json.dumps(dict(TINY["llama"], vocab_size=256, torch_dtype="float32")))
    return folder


@pytest.fixture
def data_folder(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [{"prompt": "the quick brown fox " * n, "completion": "jumps over the lazy dog " * n} for n in range(1, 41)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def probe_json(*args):
    result = CliRunner().invoke(cli, ["probe", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_config_file_and_data_drive_the_estimate(tmp_path, model_with_tokenizer, data_folder, platform):
    platform(LINUX_CPU)
    config = tmp_path / "lora.yaml"
    config.write_text(
        f"model: {model_with_tokenizer}\ndata: {data_folder}\nbatch_size: 2\nmax_seq_length: 256\n"
        "num_layers: 2\nlora_parameters: {rank: 4, scale: 10.0, dropout: 0.0}\n"
    )
    data = probe_json("-c", str(config), "--batch-size", "4")
    sources = {k: v["source"] for k, v in data["config"]["config"].items()}
    assert sources["batch_size"] == "flag" and data["training"]["batch_size"] == 4
    assert sources["max_seq_length"] == "file" and sources["rank"] == "file" and data["training"]["rank"] == 4
    assert sources["optimizer"] == "default"
    stats = data["data"]
    assert stats["examples"] == 40 and stats["worst_batch_tokens"] <= 256
    assert set(stats) >= {"examples", "p50", "p90", "p99", "max", "truncated", "worst_batch_tokens"}
    training = TrainingConfig(batch_size=4, max_seq_length=256, num_layers=2, rank=4, scale=10.0)
    expected = estimate(from_folder(model_with_tokenizer), training, "cpu", length=stats["worst_batch_tokens"])
    lora = next(e for e in data["estimates"] if e["method"] == "lora")
    assert lora["predicted_peak_bytes"] == expected.peak_bytes


def test_unknown_config_keys_are_reported(tmp_path, model_with_tokenizer):
    config = tmp_path / "lora.yaml"
    config.write_text(f"model: {model_with_tokenizer}\nnum_layers: 2\nbatch_sise: 8\n")
    assert probe_json("-c", str(config))["config"]["unknown_keys"] == ["batch_sise"]
    text = " ".join(CliRunner().invoke(cli, ["probe", "-c", str(config)]).output.split())
    assert "unknown key 'batch_sise'" in text


def test_advice_comes_before_the_units_footer(model_with_tokenizer, data_folder):
    args = ["probe", "--model", str(model_with_tokenizer), "--num-layers", "2", "--data", str(data_folder), "--max-seq-length", "64"]
    out = CliRunner().invoke(cli, args, catch_exceptions=False).output
    assert "advice:" in out and out.splitlines()[-1].endswith("GB = 10^9 bytes.")
    out = CliRunner().invoke(cli, [*args, "-v"], catch_exceptions=False).output
    assert "advice:" in out and out.splitlines()[-1] == "GB = 10^9 bytes."


def test_truncation_advice(model_with_tokenizer, data_folder):
    data = probe_json("--model", str(model_with_tokenizer), "--num-layers", "2", "--data", str(data_folder), "--max-seq-length", "64")
    assert data["data"]["truncated"] > 0
    assert any("longer than --max-seq-length 64" in note for note in data["advice"])
    assert any("keeps 95% of examples whole" in note for note in data["advice"])


def test_malformed_data_line_is_named(tmp_path, model_with_tokenizer):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "fine"}\n{not json\n')
    result = CliRunner().invoke(cli, ["probe", "--model", str(model_with_tokenizer), "--num-layers", "2", "--data", str(folder)])
    assert result.exit_code != 0 and "line 2" in result.output and "Traceback" not in result.output


def test_missing_config_file():
    result = CliRunner().invoke(cli, ["probe", "-c", "/nonexistent/lora.yaml"])
    assert result.exit_code == 2 and "lora.yaml" in result.output


def test_data_width_on_the_run_line_and_plans_keep_the_long_tail(model_with_tokenizer, data_folder):
    """The Run line shows the widest batch the estimate uses; a plan never cuts below
    the length that keeps 99% of the examples whole."""
    args = ["--model", str(model_with_tokenizer), "--num-layers", "-1", "--data", str(data_folder),
            "--max-seq-length", "2048", "--batch-size", "8", "--memory", "0.04GB", "--reserve", "0"]
    data = probe_json(*args)
    width = data["data"]["worst_batch_tokens"]
    text = " ".join(CliRunner().invoke(cli, ["probe", *args]).output.split())
    assert f"batch 8 × {width} tokens (your data's widest batch; --max-seq-length 2048)" in text
    floor = data["data"]["max"]  # 40 examples: keeping 99% whole keeps every one
    proposed = [o["flags"] for o in data["plan"]] + [r["change"] for r in data["remedies"]]
    assert proposed
    for flags in proposed:
        words = flags.split()
        if "--max-seq-length" in words:
            assert int(words[words.index("--max-seq-length") + 1]) >= floor


def test_a_measurement_with_data_is_keyed_by_its_widest_batch(model_with_tokenizer, data_folder, platform):
    """A measurement of batch 2 × the data's widest batch corrects runs of about that
    many tokens, not a run at max_seq_length (several times the tokens)."""
    platform(LINUX_CPU)
    common = ["--model", str(model_with_tokenizer), "--num-layers", "-1", "--batch-size", "2"]
    measured = probe_json(*common, "--data", str(data_folder), "--max-seq-length", "2048", "--measure")
    width = measured["data"]["worst_batch_tokens"]
    assert 4 * width <= 2048  # the data is far shorter than max_seq_length
    listing = CliRunner().invoke(cli, ["calibration", "--json"])
    (entry,) = json.loads(listing.output)["measurements"]
    assert entry["length"] == width
    text = " ".join(CliRunner().invoke(cli, ["calibration"], env={"COLUMNS": "120"}).output.split())
    assert f"b2×{width}" in text
    assert probe_json(*common, "--max-seq-length", "2048")["calibration"] is None  # 4x the tokens and more
    assert probe_json(*common, "--max-seq-length", str(width))["calibration"]["measurements"] == 1
    assert probe_json(*common, "--data", str(data_folder), "--max-seq-length", "2048")["calibration"]["measurements"] == 1
