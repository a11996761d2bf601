"""Flags that would change nothing, or two that contradict each other, are refused in one
line; what is accepted, the text and the JSON report alike."""

import json
import shutil

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from tiny_configs import TINY


def run(*args):
    return CliRunner().invoke(cli, list(args))


def one_line_error(result, exit_code=2):
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


def test_bits_on_a_model_stored_quantized_is_refused_naming_the_stored_bits():
    result = run("probe", "mlx-community/Qwen3-0.6B-4bit", "--bits", "8")
    text = one_line_error(result)
    assert "--bits 8: mlx-community/Qwen3-0.6B-4bit is stored 4-bit (group 64)" in text
    assert "leave --bits out" in text
    text = one_line_error(run("probe", "mlx-community/Qwen3-0.6B-4bit", "--group-size", "128"))
    assert "--group-size 128: mlx-community/Qwen3-0.6B-4bit is stored 4-bit (group 64)" in text


def test_bits_agreeing_with_the_stored_bits_or_on_a_float_base_is_taken():
    stored = json.loads(run("probe", "mlx-community/Qwen3-0.6B-4bit", "--bits", "4", "--json").output)
    assert stored["model"]["bits"] == 4
    result = run("probe", "Qwen/Qwen3-0.6B", "--method", "qlora", "--bits", "8", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["training"]["bits"] == 8
    text = " ".join(run("probe", "Qwen/Qwen3-0.6B", "--method", "qlora", "--bits", "8").output.split())
    assert "base quantized to 8 bits" in text


def test_two_load_in_flags_are_refused():
    result = run("probe", "Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--load-in-4bits", "--load-in-8bits")
    text = one_line_error(result)
    assert "--load-in-4bits with --load-in-8bits: give one" in text


@pytest.mark.parametrize("flag", ["--skip-bad-lines", "--trust-remote-code"])
def test_data_flags_without_data_are_refused_as_slice_without_measure(flag):
    text = one_line_error(run("probe", "Qwen/Qwen3-0.6B", flag))
    assert f"{flag} is about --data: add --data (or leave {flag} out)" in text
    # the same wording as a measuring flag without --measure
    assert "--slice is about measuring: add --measure" in one_line_error(run("probe", "--slice"))


def test_trust_remote_code_without_data_is_refused_in_a_preference_mode():
    text = one_line_error(run("probe", "Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--trust-remote-code"))
    assert "--trust-remote-code is about --data" in text


def test_skip_bad_lines_is_refused_in_a_preference_mode(tmp_path):
    text = one_line_error(run("probe", "Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--skip-bad-lines"))
    assert "--skip-bad-lines with --train-mode dpo" in text


def test_data_flags_with_data_from_the_config_file_are_taken(tmp_path, tokenizer_folder):
    model = tmp_path / "model"
    shutil.copytree(tokenizer_folder, model)
    (model / "config.json").write_text(json.dumps(dict(TINY["llama"], vocab_size=256, torch_dtype="float32")))
    rows = [json.dumps({"text": "the quick brown fox jumps"})] * 4 + ["not json"]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    config = tmp_path / "lora.yaml"
    config.write_text(f"model: {model}\ndata: {tmp_path}\nbatch_size: 2\nnum_layers: 2\n")
    result = run("probe", "-c", str(config), "--skip-bad-lines", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["data"]["skipped_lines"] == 1


@pytest.mark.parametrize("value", ["0", "false", "no", ""])
def test_debug_switch_off_values_keep_errors_one_line(monkeypatch, value):
    monkeypatch.setenv("MLXFIT_DEBUG", value)
    result = run("probe", "--model", "gibberish")
    assert result.exit_code == 1 and "unknown model" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_debug_switch_true_values_reraise(monkeypatch, value):
    monkeypatch.setenv("MLXFIT_DEBUG", value)
    result = run("probe", "--model", "gibberish")
    assert result.exception is not None and "unknown model" in str(result.exception)
