"""--lora-dropout: one flag for every mode, read as each trainer reads its dropout."""

import json

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli

MODEL = "Qwen/Qwen3-0.6B"
RUN = ("--memory", "16GB", "--batch-size", "2", "--max-seq-length", "256")


def probe(*args):
    return CliRunner().invoke(cli, ["probe", MODEL, *RUN, *map(str, args)])


def peak(result):
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    return next(e for e in d["estimates"] if e["method"] == "lora")["predicted_peak_bytes"], d


def test_the_flag_is_mlx_lms_lora_parameters_dropout(tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("lora_parameters:\n  rank: 8\n  scale: 20.0\n  dropout: 0.05\n")
    none, _ = peak(probe("--json"))
    flag, d = peak(probe("--lora-dropout", "0.05", "--json"))
    assert peak(probe("-c", config, "--json"))[0] == flag > none
    assert d["training"]["dropout"] == 0.05


def test_the_flag_reaches_mlx_lm_loras_trainer():
    r = probe("--train-mode", "dpo", "--lora-dropout", "0.1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["run"]["training"]["dropout"] == 0.1


@pytest.mark.parametrize("value", ["1", "-0.1", "1.5"])
def test_a_dropout_outside_mlxs_range_is_one_line(value):
    # mlx/nn/layers/dropout.py: Dropout refuses p outside [0, 1).
    import mlx.nn as nn

    with pytest.raises(ValueError):
        nn.Dropout(float(value))
    r = probe("--lora-dropout", value)
    assert r.exit_code != 0 and "dropout" in r.output and "Traceback" not in r.output


def test_a_run_with_dropout_is_offered_none_as_a_change_sized_like_that_run():
    args = ("--model", "Qwen/Qwen3-4B", "--memory", "24GB", "--batch-size", "4", "--max-seq-length", "512",
            "--num-layers", "36", "--json")
    d = json.loads(CliRunner().invoke(cli, ["probe", *args, "--lora-dropout", "0.05"]).output)
    change = next(r for r in d["remedies"] if r["change"] == "--lora-dropout 0")
    without = json.loads(CliRunner().invoke(cli, ["probe", *args]).output)
    assert change["new_bytes"] == next(e for e in without["estimates"] if e["method"] == "lora")["predicted_peak_bytes"]
    assert not any("--lora-dropout" in r["change"] for r in without["remedies"])
