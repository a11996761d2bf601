"""One answer a user can act on (plans, labels, layout, input, messages)."""

import json
import shlex

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from conftest import GB, LINUX_CPU
from tiny_configs import TINY

QWEN7 = "Qwen/Qwen2.5-7B-Instruct"


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, env={"COLUMNS": "80", **(env or {})})


def run(*args, exit_code=0):
    result = invoke(*args)
    assert result.exit_code == exit_code, result.output
    return result.output


def run_json(*args):
    return json.loads(run(*args, "--json"))


def selected(data):
    return next(e for e in data["estimates"] if e["selected"])


# --- 1. a plan, not a list --------------------------------------------------------


def test_7b_on_16gb_names_a_plan_that_fits_without_another_model_or_short_examples():
    base = ("probe", "--model", QWEN7, "--memory", "16GB")
    data = run_json(*base)
    assert not selected(data)["fits"]
    best = data["plan"][0]
    assert best["fits"] and best["model"] == QWEN7 and "--model" not in best["flags"]
    words = shlex.split(best["flags"])
    if "--max-seq-length" in words:
        assert int(words[words.index("--max-seq-length") + 1]) >= 512
    # The flags are pasteable: probing again with them confirms the plan.
    again = run_json(*base, *words)
    assert selected(again)["fits"] and selected(again)["predicted_peak_bytes"] == best["new_bytes"]
    assert 2 <= len(data["plan"]) <= 4
    for option in data["plan"][1:]:
        assert option["fits"] and selected(run_json(*base, *shlex.split(option["flags"])))["fits"]


@pytest.mark.parametrize("method", [("--method", "full"), ("--fine-tune-type", "full")])
def test_full_run_plans_paste_onto_either_way_of_asking_for_full(method):
    base = ("probe", "--model", "Qwen/Qwen2.5-3B-Instruct", *method, "--memory", "16GB")
    data = run_json(*base)
    switches = [o for o in data["plan"] if "--fine-tune-type lora" in o["flags"]]
    assert switches
    for option in switches:
        again = run_json(*base, *shlex.split(option["flags"]))
        assert selected(again)["method"] in ("lora", "qlora") and selected(again)["fits"]


def test_plan_prefers_what_costs_only_speed():
    # Qwen2.5-1.5B LoRA on a 24 GB Mac: checkpointing and a smaller batch suffice,
    # so nothing that changes the training (truncation, 4-bit base, layers) is proposed first.
    data = run_json("probe", "--model", "Qwen/Qwen2.5-1.5B-Instruct", "--memory", "24GB")
    assert not selected(data)["fits"]
    best = data["plan"][0]
    assert best["speed_only"], best
    assert "--max-seq-length" not in best["flags"]


def test_without_data_no_cut_below_512_tokens():
    data = run_json("probe", "--model", "meta-llama/Llama-3.2-1B-Instruct", "--memory", "24GB")
    flags = " ".join([o["flags"] for o in data["plan"]] + [r["change"] for r in data["remedies"]])
    for n in (16, 32, 64, 128, 256):
        assert f"--max-seq-length {n} " not in flags + " "


def test_remedies_that_do_not_move_the_estimate_are_dropped():
    data = run_json("probe", "--model", QWEN7, "--memory", "24GB")
    assert not any(r["change"].startswith("--rank") for r in data["remedies"])
    assert not any("--rank" in o["flags"] for o in data["plan"])


def test_model_remedy_is_a_real_catalog_model_by_the_detailed_estimate():
    base = ("--max-seq-length", "1024", "--memory", "36GB")
    data = run_json("probe", "--model", "Qwen/Qwen2.5-14B-Instruct", *base)
    model_changes = [r for r in data["remedies"] if r["change"].startswith("--model")]
    assert len(model_changes) == 1 and model_changes[0]["fits"]
    other = shlex.split(model_changes[0]["change"])[1]
    check = run_json("probe", "--model", other, *base)
    # The same family first (then the same architecture, then the same maker; never
    # an unrelated model): the largest smaller Qwen2.5 that fits these settings outright.
    assert other.startswith("Qwen/Qwen2.5-") and check["model"]["params"] < 14e9
    assert selected(check)["predicted_peak_bytes"] == model_changes[0]["new_bytes"] <= 27 * GB
    # Llama-3.2-1B at 4 x 4096 tokens: the rule once offered "a model of at most
    # 12.00B parameters"; by the detailed estimate no smaller catalog model fits.
    data = run_json("probe", "--model", "meta-llama/Llama-3.2-1B-Instruct", "--max-seq-length", "4096", "--memory", "36GB")
    assert "at most" not in json.dumps(data["remedies"])
    assert all(r["fits"] for r in data["remedies"] if r["change"].startswith("--model"))


def test_with_data_the_cut_keeps_the_long_tail():
    from types import SimpleNamespace

    from mlxfit.estimate.remedies import length_floor
    from mlxfit.model.training import TrainingConfig

    data = SimpleNamespace(lengths=list(range(1, 1001)))
    assert length_floor(TrainingConfig(), data) == 990  # 99% of examples stay whole
    assert length_floor(TrainingConfig()) == 512
    assert length_floor(TrainingConfig(max_seq_length=256)) == 256  # asked for less


def test_text_names_the_plan_and_its_costs():
    out = run("probe", "--model", QWEN7, "--memory", "16GB", "-v")
    assert "The plan that fits at the least cost:" in out and "Alternatives:" in out
    assert "recomputes the trained blocks' forward" in " ".join(out.split()) and "Cheapest single change" not in out


# --- 2. one basis per verdict ------------------------------------------------------


def test_fits_states_the_rule_and_shows_a_real_model_beside_it(platform):
    platform(LINUX_CPU)
    data = run_json("fits", "--memory", "36GB")
    assert data["basis"]["estimates"].startswith("rule") and data["basis"]["answer"].startswith("detailed")
    seven = next(r for r in data["rows"] if r["params"] == 7 * 10**9)
    assert seven["estimates"][0]["rule_bytes"] == 17 * GB  # the source's table, unchanged
    ref = seven["reference"]
    assert 6.5e9 < ref["params"] < 8e9 and (ref["batch_size"], ref["max_seq_length"]) == (4, 2048)
    assert ref["estimates"]["lora"]["predicted_peak_bytes"] > 27 * GB
    out = run("fits", "--memory", "36GB")
    assert "moderate lengths and small batches" in out and "worst case" in out
    assert "SPEC" not in out


def test_bare_size_says_it_is_the_rule_and_shows_a_catalog_model():
    data = run_json("probe", "--model", "7B", "--memory", "36GB")
    assert data["basis"] == "rule" and data["reference"]["estimates"]["lora"]["predicted_peak_bytes"] > 50 * GB
    out = " ".join(run("probe", "--model", "7B", "--memory", "36GB").split())
    assert "rule of thumb: batch, length and layers not counted" in out
    assert "× 2,048 tokens (the worst case" not in out  # the Run line no longer claims a length
    assert "A real model of this size" in out and "--model" in out


def test_bare_size_reference_uses_the_stated_settings():
    data = run_json("probe", "--model", "7B", "--batch-size", "1", "--max-seq-length", "512")
    assert (data["reference"]["batch_size"], data["reference"]["max_seq_length"]) == (1, 512)
    out = " ".join(run("probe", "--model", "7B", "--batch-size", "1", "--max-seq-length", "512").split())
    assert "batch 1 × 512 tokens (your settings" in out


def test_bare_size_full_remedies_paste_onto_fine_tune_type_full():
    base = ("probe", "--model", "7B", "--fine-tune-type", "full", "--memory", "36GB")
    for remedy in run_json(*base)["remedies"]:
        if remedy["change"].startswith("--method"):
            row = selected(run_json(*base, *shlex.split(remedy["change"])))
            assert (row["verdict"], row["fits"]) == (remedy["verdict"], remedy["fits"])  # the remedy judged as its row


def test_estimate_far_above_the_rule_says_why():
    first = " ".join(run("probe", "--model", QWEN7, "--memory", "16GB").split())
    assert "× the rule of thumb: the step's activations and attention scores" in first
    out = " ".join(run("probe", "--model", QWEN7, "--memory", "16GB", "-v").split())
    assert "× the rule: at batch 4 × 2,048 tokens the step holds" in out
    assert "attention scores" in out and "(the worst case; --data sizes yours)" in out


# --- 3. truthful labels --------------------------------------------------------------


def test_run_line_names_qlora_and_dora():
    out = run("probe", "--model", "Qwen/Qwen3-0.6B", "--method", "qlora")
    assert "Run      QLoRA ·" in out and "Run      lora" not in out
    out = run("probe", "--model", "Qwen/Qwen3-0.6B", "--fine-tune-type", "dora")
    assert "Run      DoRA ·" in out and " DoRA ◀" in out


def test_quantized_base_has_no_identical_lora_row():
    data = run_json("probe", "--model", "mlx-community/Qwen2.5-7B-Instruct-4bit")
    assert [e["method"] for e in data["estimates"]] == ["qlora", "full"]
    out = " ".join(run("probe", "--model", "mlx-community/Qwen2.5-7B-Instruct-4bit", "-v").split())
    assert "4-bit base as stored" in out and "already quantized" in out


def write_hostfile(tmp_path, *memories):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": f"mac{i}", "ips": [], "memory": m} for i, m in enumerate(memories)]))
    return str(path)


def test_hostfile_plans_for_the_smallest_node_and_says_so(platform, tmp_path):
    platform(LINUX_CPU)
    hostfile = write_hostfile(tmp_path, "64GB", "16GB")
    data = run_json("probe", "--model", QWEN7, "--hostfile", hostfile)
    assert data["machine"]["total_bytes"] == 16 * GB  # not this Linux box
    out = run("probe", "--model", QWEN7, "--hostfile", hostfile)
    assert "per node: 2 hosts" in out and "planned for the smallest, mac1" in out
    assert "(hypothetical)" not in out
    assert all(len(line) <= 80 for line in out.splitlines() if hostfile not in line)


# --- 4. no crashes --------------------------------------------------------------------


@pytest.mark.parametrize("hosts", ["2", "4"])
def test_hosts_on_a_run_that_does_not_fit(hosts):
    data = run_json("probe", "--model", QWEN7, "--memory", "16GB", "--hosts", hosts)
    assert data["plan"]
    for option in data["plan"]:
        words = shlex.split(option["flags"])
        if "--batch-size" in words:
            assert int(words[words.index("--batch-size") + 1]) % int(hosts) == 0


def test_hostfile_on_a_run_that_does_not_fit(platform, tmp_path):
    platform(LINUX_CPU)
    data = run_json("probe", "--model", QWEN7, "--hostfile", write_hostfile(tmp_path, "16GB", "16GB"))
    assert not selected(data)["fits"] and data["plan"][0]["fits"]


def test_positional_model_is_accepted():
    assert run_json("probe", QWEN7)["model"]["id"] == QWEN7
    # A plan's --model pastes onto a positional model: the flag wins.
    assert run_json("probe", QWEN7, "--model", "Qwen/Qwen3-0.6B")["model"]["id"] == "Qwen/Qwen3-0.6B"


def test_when_nothing_else_fits_the_plan_is_a_smaller_catalog_model():
    base = ("probe", "Qwen/Qwen2.5-72B-Instruct", "--memory", "8GB")
    data = run_json(*base)
    best = data["plan"][0]
    assert best["flags"].startswith("--model Qwen/Qwen2.5-") and best["fits"]
    again = run_json(*base, *shlex.split(best["flags"]))
    assert again["model"]["id"] == best["model"] and selected(again)["predicted_peak_bytes"] == best["new_bytes"]


@pytest.mark.parametrize("option", ["--out", "--plot"])
def test_bench_output_folder_checked_before_measuring(tmp_path, option, monkeypatch):
    import mlxfit.measure.bench

    monkeypatch.setattr(mlxfit.measure.bench, "run_sweep", lambda *a, **k: pytest.fail("measured before checking"))
    out = run("bench", "--model", "Qwen/Qwen3-0.6B", option, str(tmp_path / "missing" / "r.file"), exit_code=2)
    assert "does not exist" in out and "Traceback" not in out


# --- 5. 80 columns, no colour ---------------------------------------------------------


@pytest.mark.parametrize("args", [
    ("probe", "--model", QWEN7, "--memory", "16GB"),
    ("probe", "--model", "meta-llama/Llama-3.2-1B-Instruct", "--max-seq-length", "4096", "--memory", "36GB"),
    ("probe", "--model", "7B", "--memory", "36GB"),
    ("probe", "--model", QWEN7, "--memory", "16GB", "-v"),
    ("probe", "--model", "7B", "--memory", "36GB", "-v"),
    ("fits", "--memory", "36GB"),
])
def test_output_fits_80_columns(args):
    out = run(*args)
    too_wide = [line for line in out.splitlines() if len(line) > 80]
    assert not too_wide, too_wide


def test_piped_legend_tells_parts_apart():
    out = run("probe", "--model", QWEN7, "--memory", "16GB", "-v")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "weights (frozen)" in line and "·" not in line)
    end = next(i for i, line in enumerate(lines) if "your run peaks" in line)
    legend = lines[start:end]
    glyphs = [word for line in legend for word in line.split() if len(word) == 1]
    assert len(glyphs) >= 6 and len(set(glyphs)) == len(glyphs)


def test_distinct_colours_per_part():
    from mlxfit.render.probe import PART_STYLES

    from rich.color import Color, ColorSystem

    # Distinct even where a terminal has only the 16 standard colours (grey62 and
    # white both became white there).
    standard = {Color.parse(c).downgrade(ColorSystem.STANDARD).number for c in PART_STYLES.values()}
    assert len(standard) == len(PART_STYLES)


def test_tiny_model_bars_are_not_empty(model_folder):
    out = run("probe", "--model", str(model_folder(TINY["llama"])), "--memory", "36GB", "--num-layers", "-1", "-v")
    bars = [line for line in out.splitlines() if "│" in line and line.strip().startswith(("LoRA", "QLoRA", "full"))]
    assert bars and all(line.split("│")[0].replace("·", "").split()[1:] for line in bars)


# --- 6. input that cannot be right ------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (("--max-seq-length", "1000000"), "past Qwen/Qwen2.5-7B-Instruct's context of 32,768 tokens"),
    (("--method", "qlora", "--group-size", "7"), "group-size must be one of 32, 64, 128"),
    (("--method", "lora", "--fine-tune-type", "full"), "--method lora conflicts with --fine-tune-type full"),
    (("--method", "full", "--fine-tune-type", "dora"), "--method full conflicts with --fine-tune-type dora"),
])
def test_input_that_cannot_be_right(args, message):
    result = invoke("probe", "--model", QWEN7, *args)
    assert result.exit_code == 2 and message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_method_overrides_a_config_files_fine_tune_type(tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("fine_tune_type: full\n")
    data = run_json("probe", "--model", QWEN7, "-c", str(config), "--method", "qlora")
    assert selected(data)["method"] == "qlora"


def test_apple_gb_sizes_get_a_gib_note():
    data = run_json("memory", "--memory", "36GB")
    assert any("36 GiB" in w and "give 36GiB" in w for w in data["machine"]["warnings"])
    assert not run_json("memory", "--memory", "36GiB")["machine"]["warnings"]
    assert not run_json("memory", "--memory", "40GB")["machine"]["warnings"]


# --- 7. messages -----------------------------------------------------------------------


def test_json_error_is_not_at_at(tmp_path):
    from mlxfit.model.dataset import _BadLine, _parse

    with pytest.raises(_BadLine) as e:
        _parse(b'{"prompt": "unterminated')
    assert " at at " not in str(e.value) and "at column" in str(e.value)


def test_one_malformed_line_is_singular(capsys):
    from mlxfit.model.dataset import DataStats
    from mlxfit.render.inputs import render_data

    stats = DataStats("t.jsonl", "text", 3, 1, 1, 1, 1, 0, 0, 33, 4, 2048, "approx", True,
                      skipped_lines=1, bad_lines=((2, "is empty"),))
    render_data(stats)
    assert "skipped 1 malformed line (first: 2)" in capsys.readouterr().out


def test_no_references_a_user_cannot_follow():
    for args in (("probe", "--model", "7B"), ("probe", "--model", QWEN7, "--memory", "16GB"), ("fits",)):
        out = run(*args)
        assert "SPEC" not in out and "the source" not in out and "issue" not in out


def test_optimizer_has_help():
    assert "its state is part of the peak" in " ".join(run("probe", "--help").split())


def test_ctrl_c_exits_130(monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("mlxfit.estimate.plan.make_plan", interrupted)
    result = CliRunner().invoke(cli, ["probe"])
    assert result.exit_code == 130 and "Traceback" not in result.output


def test_ctrl_c_during_a_measurement_exits_130(monkeypatch):
    from mlxfit.measure.parent import MeasurementInterrupted

    def interrupted(*a, **k):
        raise MeasurementInterrupted("interrupted at step 2; the measuring process was stopped")

    monkeypatch.setattr("mlxfit.measure.parent.measure", interrupted)
    result = CliRunner().invoke(cli, ["probe", "--model", "Qwen/Qwen3-0.6B", "--batch-size", "1",
                                      "--max-seq-length", "64", "--memory", "64GB", "--measure"])
    assert result.exit_code == 130 and "interrupted at step 2" in result.output


def test_one_token_is_singular():
    from mlxfit.render.text import tokens

    assert tokens(1) == "1 token" and tokens(2048) == "2,048 tokens"
