"""`probe -c lora.yaml --data DIR`: mlx-lm's config and the user's own data drive the plan."""

import json

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.detailed import estimate
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU


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


def test_a_tokenizer_file_not_in_utf8_is_named_in_one_line(tmp_path, model_with_tokenizer, data_folder):
    config = model_with_tokenizer / "tokenizer_config.json"
    config.write_bytes(config.read_bytes().replace(b'"<unk>"', '"<unk\xe9>"'.encode("latin-1"), 1))
    result = CliRunner().invoke(cli, ["probe", "--model", str(model_with_tokenizer), "--num-layers", "2",
                                      "--data", str(data_folder)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"Error: cannot load the tokenizer in {model_with_tokenizer}: {config} is not UTF-8 text (byte 0xe9")


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


def test_transformers_notices_stay_off_the_output(model_with_tokenizer, data_folder):
    """Loading the tokenizer imports transformers, which printed "[transformers] PyTorch was
    not found. Models won't be available ..." into probe's output (a fresh process: the
    notice comes once, at import)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRANSFORMERS_")}
    result = subprocess.run(
        [sys.executable, "-m", "mlxfit", "probe", "--model", str(model_with_tokenizer), "--num-layers", "2",
         "--data", str(data_folder), "--max-seq-length", "256", "-v"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "[transformers]" not in result.stdout + result.stderr
    assert "PyTorch" not in result.stdout + result.stderr
    assert "Data" in result.stdout.split()  # mlxfit's own output is all there


# -- how --data's tokens are counted: the model's tokenizer, fetched like its config, or characters, said so

CHARACTERS = "characters (4 per token, assumed: no tokenizer)"


@pytest.fixture
def hub_online(monkeypatch):
    """The Hub as if it could be reached (HF_HUB_OFFLINE unset, the endpoint reachable);
    `download` replaces hf_hub_download: no test reaches the network."""
    import huggingface_hub
    import huggingface_hub.constants

    import mlxfit.model.resolve as resolve

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(resolve, "_reachable", lambda *a, **k: True)
    asked = []

    def use(download):
        def recorded(repo_id, filename, **kwargs):
            asked.append((repo_id, filename))
            return download(repo_id, filename)

        monkeypatch.setattr(huggingface_hub, "hf_hub_download", recorded)
        return asked

    return use


def probe_text(*args):
    result = CliRunner().invoke(cli, ["probe", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_a_local_model_folder_counts_tokens_with_its_tokenizer(model_with_tokenizer, data_folder):
    args = ("--model", str(model_with_tokenizer), "--num-layers", "2", "--data", str(data_folder))
    stats = probe_json(*args)["data"]
    assert stats["tokens_counted_by"] == "tokenizer" and stats["no_tokenizer_reason"] is None
    assert stats["tokenizer_source"] == "model folder" and not stats["approximate"]
    text = probe_text(*args)
    assert "tokens counted by the tokenizer (model folder)" in text and "characters" not in text


def test_a_hub_id_fetches_its_tokenizer_as_it_fetches_the_config(hub_online, tokenizer_folder, data_folder):
    """The tokenizer's small files come through huggingface_hub like config.json (its
    cache, HF_HUB_OFFLINE): here a stand-in Hub serves the tiny tokenizer's files."""
    from huggingface_hub.errors import EntryNotFoundError

    def download(repo_id, filename):
        if not (tokenizer_folder / filename).is_file():
            raise EntryNotFoundError(f"{filename} is not in {repo_id}")
        return str(tokenizer_folder / filename)

    asked = hub_online(download)
    stats = probe_json("Qwen/Qwen3-0.6B", "--data", str(data_folder))["data"]
    assert stats["tokens_counted_by"] == "tokenizer" and stats["tokenizer_source"] == "fetched from the Hugging Face Hub"
    assert {name for _, name in asked} >= {"tokenizer.json", "tokenizer_config.json"}
    assert all(repo == "Qwen/Qwen3-0.6B" and not name.endswith(".safetensors") for repo, name in asked)
    from mlxfit.model.dataset import approximation, measure

    assert measure(data_folder, approximation()).p50 != stats["p50"]  # the tokenizer's own count, not 4 characters


def test_a_hub_id_that_cannot_be_fetched_says_it_counted_characters(hub_online, data_folder):
    def download(repo_id, filename):
        raise OSError("[Errno 101] Network is unreachable")

    hub_online(download)
    args = ("Qwen/Qwen3-0.6B", "--data", str(data_folder))
    stats = probe_json(*args)["data"]
    assert stats["tokens_counted_by"] == CHARACTERS and stats["approximate"]
    assert stats["no_tokenizer_reason"] == ("could not fetch the tokenizer of Qwen/Qwen3-0.6B: "
                                            "[Errno 101] Network is unreachable")
    text = probe_text(*args)
    assert f"warning: tokens counted by {CHARACTERS}: could not fetch the tokenizer of Qwen/Qwen3-0.6B" in text


def test_offline_a_hub_id_counts_characters_and_says_why(data_folder):
    """HF_HUB_OFFLINE (set for every test) and nothing cached: no fetch, the assumption said."""
    stats = probe_json("Qwen/Qwen3-0.6B", "--data", str(data_folder))["data"]
    assert stats["tokens_counted_by"] == CHARACTERS
    assert "not in the Hugging Face cache" in stats["no_tokenizer_reason"]
    assert f"tokens counted by {CHARACTERS}: the tokenizer of Qwen/Qwen3-0.6B is not in the Hugging Face cache" \
        in probe_text("Qwen/Qwen3-0.6B", "--data", str(data_folder))


@pytest.fixture
def preference_data(tmp_path):
    folder = tmp_path / "pref"
    folder.mkdir()
    rows = [{"prompt": "the quick fox " * (i + 1), "chosen": "a model " * (3 * i + 1), "rejected": "dog " * i} for i in range(6)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_preference_data_without_a_tokenizer_counts_characters_as_sft_does(hub_online, preference_data):
    """--train-mode dpo --data refused where SFT counted characters; now both count them and say so."""
    pytest.importorskip("mlx_lm_lora")

    def download(repo_id, filename):
        raise OSError("[Errno 101] Network is unreachable")

    hub_online(download)
    args = ("Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--batch-size", "2", "--data", str(preference_data))
    data = probe_json(*args)
    assert data["data"]["tokens_counted_by"] == CHARACTERS
    assert data["data"]["no_tokenizer_reason"].startswith("could not fetch the tokenizer of Qwen/Qwen3-0.6B")
    assert data["estimate"]["length"] == data["data"]["widest"] > 0  # the data sizes the run, as with a tokenizer
    text = probe_text(*args)
    assert f"warning: tokens counted by {CHARACTERS}: could not fetch the tokenizer" in text


def test_preference_data_with_a_tokenizer_says_so(model_with_tokenizer, preference_data):
    pytest.importorskip("mlx_lm_lora")
    args = ("--model", str(model_with_tokenizer), "--train-mode", "dpo", "--batch-size", "2", "--data", str(preference_data))
    assert probe_json(*args)["data"]["tokens_counted_by"] == "tokenizer"
    assert "tokens counted by the tokenizer" in probe_text(*args)
