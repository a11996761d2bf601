"""Every line agrees with the others, and bad input ends in one line, not a traceback."""

import json

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "80", **(env or {})})


def words(text: str) -> str:
    return " ".join(text.split())


def selected(data):
    return next(e for e in data["estimates"] if e["selected"])


# --- one verdict per row, and the words under it agree ---------------------------


@pytest.mark.parametrize("args", [
    ("Qwen/Qwen3-4B", "--memory", "16GB", "--batch-size", "1", "--max-seq-length", "1024"),
    ("Qwen/Qwen3-14B", "--memory", "112GiB"),
], ids=["4b-16gb", "14b-112gib"])
def test_a_tight_row_is_not_called_does_not_fit(args):
    data = json.loads(invoke("probe", *args, "--json").output)
    low, high = selected(data)["predicted_range_bytes"]
    assert selected(data)["verdict"] == "tight" and low <= data["machine"]["usable_bytes"] < high
    text = words(invoke("probe", *args, "-v").output)
    assert "LoRA does not fit" not in text
    assert "LoRA is tight for the" in text and "so it may not fit" in text
    assert "The plan that fits at the least cost:" in text
    first = words(invoke("probe", *args).output)
    row = first.split("LoRA ◀")[1].split("QLoRA")[0]
    assert "tight (it may not fit)" in row and "does not fit" not in row
    assert "The plan that fits LoRA at the least cost" in first


def test_does_not_fit_means_the_whole_range_is_above_the_budget():
    data = json.loads(invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GB", "--json").output)
    assert selected(data)["verdict"] == "does not fit"
    assert selected(data)["predicted_range_bytes"][0] > data["machine"]["usable_bytes"]
    text = words(invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GB", "-v").output)
    assert "LoRA does not fit the 12.0 GB budget with every batch 2,048 tokens long (the worst case): even the low end of the estimate's range" in text


# --- bad input: one line, a non-zero exit, nothing lost ---------------------------


def test_a_stored_measurement_missing_keys_is_ignored_not_a_crash():
    from mlxfit.estimate.calibration import measurements_dir

    folder = measurements_dir()
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text(json.dumps({"model": "x", "training": {"batch_size": 2}}))
    (folder / "list.json").write_text("[1, 2]")
    result = invoke("calibration")
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "Stored measurements" in result.output and ": 0" in result.output
    assert json.loads(invoke("calibration", "--json").output)["measurements"] == []


def test_a_huge_batch_size_gets_its_plan():
    """Its accumulation remedies are the divisors of 10^9 (found in pairs up to the
    square root: walking every number below 10^9 took minutes)."""
    result = invoke("probe", "Qwen/Qwen3-0.6B", "--batch-size", "1000000000", "--json")
    assert result.exit_code == 0, result.output
    flags = [p["flags"] for p in json.loads(result.output)["plan"]]
    assert any("--grad-accumulation-steps 500000000" in f for f in flags)


def test_batch_divisors_are_every_divisor_largest_first():
    from mlxfit.estimate.remedies import _divisors_down

    for n in range(1, 200):
        for step in (1, 2, 3):
            assert _divisors_down(n, step) == [b for b in range(n - 1, 0, -1) if n % b == 0 and b % step == 0]


LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 16,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
         "torch_dtype": "float32"}


@pytest.mark.parametrize("change, field", [
    ({"torch_dtype": "float7"}, "'torch_dtype' is 'float7'"),
    ({"vocab_size": None}, "'vocab_size' is null"),
    ({"quantization": {"bits": "four", "group_size": 64}}, "'quantization.bits' must be an integer"),
    ({"quantization": {"bits": 4, "group_size": "big"}}, "'quantization.group_size' must be a positive integer"),
], ids=["dtype", "vocab-null", "bits-four", "group-size"])
def test_a_config_value_that_names_nothing_is_refused_by_its_field(model_folder, change, field):
    result = invoke("probe", "--model", str(model_folder({**LLAMA, **change})))
    assert result.exit_code == 1 and not isinstance(result.exception, (TypeError, ValueError)), result.output
    assert result.output.startswith("Error: config.json field ") and field in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_lora_keys_that_name_no_layer_are_refused(model_folder, tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("lora_parameters:\n  keys: [nonexistent.proj]\n  rank: 8\n  scale: 20.0\n  dropout: 0.0\n")
    result = invoke("probe", "--model", str(model_folder(LLAMA)), "-c", str(config))
    assert result.exit_code == 2
    assert "lora_parameters.keys ['nonexistent.proj']: no layer of" in words(result.output)
    assert "self_attn.q_proj" in result.output
    config.write_text("lora_parameters:\n  keys: [nonexistent.proj, self_attn.q_proj]\n  rank: 8\n  scale: 20.0\n  dropout: 0.0\n")
    data = json.loads(invoke("probe", "--model", str(model_folder(LLAMA, "partly")), "-c", str(config), "--json").output)
    assert any("nonexistent.proj name no layer" in w for w in data["warnings"])


@pytest.mark.parametrize("args, message", [
    (("--model", ""), "--model is empty"),
    (("--slice",), "--slice is about measuring: add --measure"),
    (("--force",), "--force is about measuring: add --measure"),
    (("--hostfile", "HOSTFILE", "--memory", "8GB"), "--memory with --hostfile"),
    (("--hostfile", "HOSTFILE", "--hosts", "3"), "--hosts with --hostfile"),
], ids=["empty-model", "slice", "force", "hostfile-memory", "hostfile-hosts"])
def test_inputs_that_were_accepted_without_a_word(tmp_path, args, message):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": "a", "memory": "36GB"}, {"ssh": "b", "memory": "36GB"}]))
    args = [str(hostfile) if a == "HOSTFILE" else a for a in args]
    result = invoke("probe", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("json_", [False, True], ids=["text", "json"])
def test_output_to_a_full_disk_is_one_line(json_):
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "mlxfit", "fits", *(["--json"] if json_ else [])],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == "Error: cannot write the output: No space left on device\n"


# --- words that say what the model is ----------------------------------------------


def test_an_unknown_model_type_is_not_called_a_bare_size_nor_its_reference_of_this_size(model_folder):
    unknown = str(model_folder({**LLAMA, "model_type": "notamodel"}))
    text = words(invoke("probe", "--model", unknown, "-v").output)
    assert "A bare size" not in text and "mlx-lm cannot build this model here" in text
    assert "A real model of this size" not in text
    # a tiny model: no Qwen2.5 or Llama 3 within 1.5×, so the catalog's nearest stands for it, said as such
    assert "The catalog model nearest in size, LiquidAI/LFM2-350M (354M, against this one's" in text
    first = words(invoke("probe", "--model", unknown).output)
    assert "A bare size" not in first and "mlx-lm cannot build this model here" in first
    sized = words(invoke("probe", "7B", "-v").output)
    assert "A bare size has no architecture" in sized and "A real model of this size, Qwen/Qwen2.5-7B-Instruct" in sized


# --- the first answer says what fits ----------------------------------------------


def test_the_first_screen_names_the_longest_examples_that_fit_per_method():
    from mlxfit.estimate.lengths import LENGTH_UNIT
    from dataclasses import replace

    from mlxfit.estimate.sizing import sized, training_for
    from mlxfit.model.resolve import resolve_model
    from mlxfit.model.training import TrainingConfig

    out = invoke("probe", "--model", "Qwen/Qwen3-4B", "--memory", "16GB").output
    first_screen = words("\n".join(out.splitlines()[:24]))
    data = json.loads(invoke("probe", "--model", "Qwen/Qwen3-4B", "--memory", "16GB", "--json").output)
    longest = {f["method"]: f for f in data["longest_examples"]}
    assert set(longest) == {"lora", "qlora", "full"} and all(f["batch_size"] == 4 for f in longest.values())
    lora, qlora = longest["lora"]["tokens"], longest["qlora"]["tokens"]
    assert "At batch 4, the longest examples that fit the 12.0 GB budget:" in first_screen
    assert f"LoRA ◀ up to {lora:,} tokens · at 2,048:" in first_screen
    assert f"QLoRA up to {qlora:,} tokens · at 2,048:" in first_screen
    assert "2,048 tokens in every batch is the worst case" in first_screen
    verbose = invoke("probe", "--model", "Qwen/Qwen3-4B", "--memory", "16GB", "-v").output
    assert f"At batch 4, LoRA fits examples up to {lora:,} tokens; QLoRA up to {qlora:,} tokens; full" in words(verbose)
    assert "the worst case, every batch 2,048 tokens long" in words(verbose)
    # The answer is the estimate's own: that length fits by the row's promise, one unit more does not.
    model = resolve_model("Qwen/Qwen3-4B")
    usable, backend = data["machine"]["usable_bytes"], data["backend"]
    for method, n in (("lora", lora), ("qlora", qlora)):
        t = training_for(method, TrainingConfig())
        fits = lambda length: sized(model, replace(t, max_seq_length=length), backend, usable)[1].fits  # noqa: E731
        assert fits(n) and not fits(n + LENGTH_UNIT)
    # The whole answer's plan says it too.
    assert f"with examples up to {lora:,} tokens it fits as it is" in words(verbose)


def test_with_data_or_a_length_given_the_answer_is_the_runs_own():
    for args in (("--max-seq-length", "2048"),):
        data = json.loads(invoke("probe", "--model", "Qwen/Qwen3-4B", "--memory", "16GB", *args, "--json").output)
        assert data.get("longest_examples") is None
        assert "fits examples up to" not in invoke("probe", "--model", "Qwen/Qwen3-4B", "--memory", "16GB", *args).output


def test_fits_takes_the_training_flags_and_shows_one_basis_per_cell():
    default = json.loads(invoke("fits", "--memory", "16GB", "--json").output)
    short = json.loads(invoke("fits", "--memory", "16GB", "--batch-size", "1", "--max-seq-length", "512", "--json").output)
    seven = lambda data: next(r for r in data["rows"] if r["params"] == 7 * 10**9)  # noqa: E731
    assert (seven(short)["reference"]["batch_size"], seven(short)["reference"]["max_seq_length"]) == (1, 512)
    assert seven(short)["answer"]["qlora"]["bytes"] < seven(default)["answer"]["qlora"]["bytes"]
    for row in short["rows"]:
        for cell in row["answer"].values():
            assert cell["basis"] == "detailed" and cell["model"] == row["reference"]["model"]
    text = invoke("fits", "--memory", "16GB").output
    assert "By the rule of thumb" not in text  # no second verdict beside the detailed one
    line = next(l for l in text.splitlines() if l.strip().startswith("7B"))
    assert line.count("✓") + line.count("✗") + line.count("!") == 3 and "fits" not in line


def test_a_dimension_past_mlx_int32_shapes_is_refused():
    """A --batch-size of 10^17 hung probe in its plan search; MLX cannot even shape such an array."""
    import mlx.core as mx

    from mlxfit.model.training import MAX_DIMENSION

    assert mx.zeros((MAX_DIMENSION,), dtype=mx.bool_).shape == (MAX_DIMENSION,)  # lazy: nothing allocated
    with pytest.raises(OverflowError):
        mx.zeros((MAX_DIMENSION + 1,), dtype=mx.bool_)
    for flag in ("--batch-size", "--rank", "--max-seq-length"):
        result = invoke("probe", "Qwen/Qwen3-0.6B", flag, str(10**17))
        assert result.exit_code == 2 and "must be at most 2,147,483,647" in result.output, result.output
