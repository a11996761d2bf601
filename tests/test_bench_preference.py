"""`mlxfit bench --train-mode dpo|cpo|orpo|grpo`: mlx-lm-lora runs swept, estimated with
estimate_run and measured with mlx-lm-lora's own trainer (one real run; the others fake it).

SFT's bench stays as it was: tests/test_bench.py holds its tests, unchanged."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate import preference as est
from mlxfit.measure.bench import COLUMNS, CsvLog
from mlxfit.measure.bench import preference as pref_lib
from mlxfit.measure.preference import PreferenceMeasurement
from mlxfit.model import preference as pref
from mlxfit.model.resolve import resolve_model
from conftest import LINUX_CPU
from test_bench import read_csv
from tiny_configs import TINY

needs_rl = pytest.mark.skipif(not pref.installed(), reason="mlx-lm-lora is not installed (pip install 'mlxfit[rl]')")


@pytest.fixture
def tiny(model_folder, platform):
    platform(LINUX_CPU)
    return str(model_folder(TINY["llama"]))


def bench(*args, exit_code=0):
    result = CliRunner().invoke(cli, ["bench", *args])
    assert result.exit_code == exit_code, result.output
    assert "Traceback" not in result.output
    return result


def bench_json(*args, exit_code=0):
    return json.loads(bench(*args, "--json", exit_code=exit_code).stdout)


class FakeMeasure:
    """Stands in for mlxfit.measure.preference.measure: the peak is the estimate's."""

    def __init__(self):
        self.calls = []

    def __call__(self, model, run, length, prompt_length=None, steps=3, timeout=None, on_event=lambda e: None):
        self.calls.append(run)
        peak = est.estimate_run(model, run, "cpu", None, None, prompt_length).peak_bytes
        on_event({"event": "step", "step": 1, "peak_bytes": peak, "seconds": 0.0, "tokens": 0})
        return PreferenceMeasurement(peak, (peak,), peak // 2, 1, 0.1, run.compiled, (), (peak / 1e9,))


@pytest.fixture
def fake(monkeypatch):
    measure = FakeMeasure()
    monkeypatch.setattr("mlxfit.measure.preference.measure", measure)
    monkeypatch.setattr(pref, "installed", lambda: True)
    return measure


# -- (a) the estimate: estimate_run's peak and phase for each combination ----------------


@pytest.mark.parametrize("mode, args, flags", [
    ("dpo", ["--batch-size", "1,2"], [{"batch_size": 1}, {"batch_size": 2}]),
    ("grpo", ["--max-completion-length", "16,64", "--prompt-length", "32"],
     [{"max_completion_length": 16}, {"max_completion_length": 64}]),
])
def test_estimate_only_rows_are_estimate_runs_peak(tiny, mode, args, flags):
    data = bench_json("--model", tiny, "--train-mode", mode, *args, "--estimate-only", "--backend", "cpu")
    model = resolve_model(tiny)
    expected = []
    for f in flags:
        run = pref.resolve_run(mode, f, {})
        if mode == "grpo":
            from dataclasses import replace

            run = replace(run, prompt_length=32)
        e = est.estimate_run(model, run, "cpu", None, None, run.prompt_length)
        expected.append((e.peak_bytes, e.peak.name, list(e.range_bytes)))
    got = [(r["predicted_bytes"], r["peak_phase"], r["predicted_range_bytes"]) for r in data["rows"]]
    assert got == sorted(expected)  # by increasing estimate
    assert data["train_mode"] == mode and data["total"] == 2
    assert {r["status"] for r in data["rows"]} == {"estimated"}
    assert all(r["train_mode"] == mode and r["num_layers"] == -1 for r in data["rows"])  # mlx-lm-lora's defaults
    swept = "batch_size" if mode == "dpo" else "max_completion_length"
    assert list(data["swept"]) == [swept]


def test_grpo_group_size_is_the_completions_per_prompt(tiny):
    rows = bench_json("--model", tiny, "--train-mode", "grpo", "--group-size", "8", "--estimate-only")["rows"]
    assert rows[0]["grpo_group_size"] == 8 and rows[0]["group_size"] == pref.LOAD_IN_GROUP_SIZE
    assert rows[0]["prompt_length"] is None
    notes = bench_json("--model", tiny, "--train-mode", "grpo", "--estimate-only")["notes"]
    assert any("assumed to be 256 tokens" in n for n in notes)


def test_text_shows_the_mode_the_completion_column_and_the_peak_phase(tiny):
    out = " ".join(bench("--model", tiny, "--train-mode", "grpo", "--max-completion-length", "16,64",
                         "--estimate-only").output.split())
    assert "grpo (mlx_lm_lora.train)" in out and "group size 4" in out
    assert "completion" in out and "scoring step" in out and "fits (estimate)" in out


def test_without_mlx_lm_lora_the_estimate_answers_and_a_measurement_says_what_to_install(tiny, monkeypatch):
    monkeypatch.setattr(pref, "installed", lambda: False)
    bench("--model", tiny, "--train-mode", "dpo", "--batch-size", "1,2", "--estimate-only")
    result = bench("--model", tiny, "--train-mode", "dpo", exit_code=1)
    assert result.output.strip() == ("Error: bench --train-mode dpo without --estimate-only needs mlx-lm-lora, which "
                                     "is not installed: pip install 'mlxfit[rl]'")


# -- (b) measured: mlx-lm-lora's own trainer, as probe --measure runs it ------------------


@needs_rl
def test_a_measured_dpo_row_is_what_measure_returns(tiny, tmp_path, monkeypatch):
    from mlxfit.measure.preference import measure

    out = tmp_path / "r.csv"
    data = bench_json("--model", tiny, "--train-mode", "dpo", "--max-seq-length", "32", "--out", str(out))
    (row,) = data["rows"]
    assert row["status"] == "measured" and row["measured_by"] == "full" and row["steps"] == pref_lib.MOST_STEPS
    model = resolve_model(tiny)
    run = pref.resolve_run("dpo", {"max_seq_length": 32}, {})
    e = est.estimate_run(model, run, "cpu")
    assert row["predicted_bytes"] == e.peak_bytes
    direct = measure(model, run, e.length, steps=pref_lib.MOST_STEPS, timeout=300)
    # The tolerance of a measurement against its trainer (tests/test_measure_steps.py; docs/preference.md:
    # --measure within 3.2% of mlx_lm_lora.train); the seeded child usually agrees exactly.
    assert row["measured_peak_bytes"] == pytest.approx(direct.peak_bytes, rel=0.03)
    assert read_csv(out)[0]["measured_peak_bytes"] == str(row["measured_peak_bytes"])
    # --resume reads the row back as the same run: nothing is measured again.
    monkeypatch.setattr("mlxfit.measure.preference.measure", lambda *a, **k: pytest.fail("measured again"))
    again = bench_json("--model", tiny, "--train-mode", "dpo", "--max-seq-length", "32", "--out", str(out), "--resume")
    assert again["resumed"] == 1 and again["rows"][0]["measured_peak_bytes"] == row["measured_peak_bytes"]


def test_csv_rows_read_back_as_the_same_runs(tiny, fake, tmp_path):
    out = tmp_path / "r.csv"
    args = ["--model", tiny, "--train-mode", "grpo", "--batch-size", "1,2", "--max-completion-length", "8,16",
            "--prompt-length", "16", "--load-in-4bits", "--beta", "0", "--out", str(out)]
    first = bench_json(*args)
    assert len(fake.calls) == 4 and {r["status"] for r in first["rows"]} == {"measured"}
    rows = CsvLog(out, row=pref_lib.PreferenceRow).read()
    assert len(rows) == 4 and all(r.run in fake.calls for r in rows)  # each run as mlx_lm_lora.train resolves it
    assert sorted(r.key for r in rows) == sorted(pref_lib.preference_key(tiny, run) for run in fake.calls)
    fake.calls.clear()
    again = bench_json(*args, "--resume")
    assert not fake.calls and again["resumed"] == 4
    assert [r["predicted_bytes"] for r in again["rows"]] == [r["predicted_bytes"] for r in first["rows"]]


def test_over_budget_is_skipped_unless_forced(tiny, fake):
    model = resolve_model(tiny)
    need = {b: est.estimate_run(model, pref.resolve_run("cpo", {"batch_size": b}, {}), "cpu").peak_bytes for b in (1, 2)}
    memory = f"{(need[1] + need[2]) // 2}B"
    args = ["--model", tiny, "--train-mode", "cpo", "--batch-size", "1,2", "--memory", memory, "--reserve", "0"]
    rows = bench_json(*args)["rows"]
    assert [r["status"] for r in rows] == ["measured", "skipped"] and "exceeds the" in rows[1]["reason"]
    assert rows[0]["reason"].startswith("measured with compilation off")  # CPO, as probe --measure says
    assert [r["status"] for r in bench_json(*args, "--force")["rows"]] == ["measured", "measured"]


@pytest.mark.parametrize("extra", [[], ["--force"], ["--memory", "400GB"]], ids=["plain", "force", "hypothetical"])
def test_a_run_this_machine_cannot_hold_is_never_measured(platform, fake, extra):
    """No slice for mlx-lm-lora's trainers: a 7B DPO run (two copies) on a 25 GB box is
    skipped by answer_preference's rule, whatever --force or --memory say."""
    platform(LINUX_CPU)
    rows = bench_json("--model", "Qwen/Qwen2.5-7B-Instruct", "--train-mode", "dpo", "--max-seq-length", "512", *extra)["rows"]
    assert not fake.calls and [r["status"] for r in rows] == ["skipped"]
    if extra:
        assert "cannot be measured by slice" in rows[0]["reason"] and "even with --force" in rows[0]["reason"]
    else:
        assert "exceeds the" in rows[0]["reason"]  # over the budget planned for, as for SFT


# -- (c) SFT's output and files keep their format --------------------------------------


def test_sft_rows_and_files_keep_their_columns(model_folder, platform, tmp_path):
    platform(LINUX_CPU)
    folder = str(model_folder(TINY["llama"], name="sft"))
    out = tmp_path / "sft.csv"
    data = bench_json("--model", folder, "--num-layers", "-1", "--estimate-only", "--out", str(out))
    assert "train_mode" not in data and "train_mode" not in data["rows"][0]
    with open(out, newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS
    # A log of one kind is not mixed with the other.
    result = bench("--model", folder, "--train-mode", "dpo", "--estimate-only", "--out", str(out), exit_code=1)
    assert "a bench log of sft runs" in result.output


# -- (d) bad combinations: one line, no traceback ----------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--beta", "0.2"], "--beta is mlx_lm_lora.train's: add --train-mode dpo, cpo, orpo, grpo or lora_sft"),
    (["--train-mode", "dpo", "--method", "qlora"], "--method is mlx_lm.lora's"),
    (["--train-mode", "dpo", "--bits", "8"], "--bits is mlx_lm.lora's"),
    (["--train-mode", "grpo", "--max", "batch_size"], "--max is for sft runs"),
    (["--train-mode", "dpo", "--max-completion-length", "16,32"], "--train-mode dpo generates none"),
    (["--train-mode", "grpo", "--max-completion-length", "16,x"], "takes whole numbers"),
    (["--train-mode", "grpo", "--max-completion-length", "0"], "max-completion-length must be at least 1"),
    (["--train-mode", "orpo", "--optimizer", "sgd"], "optimizers are adam, adamw and muon"),
    (["--train-mode", "dpo", "--num-layers", "1,9"], "only has 2 layers"),
])
def test_bad_combinations_are_one_line(tiny, args, message):
    result = bench("--model", tiny, *args, "--estimate-only", exit_code=2)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.output


def test_a_bare_size_has_nothing_to_build_a_preference_run_on(platform):
    platform(LINUX_CPU)
    result = bench("--model", "7B", "--train-mode", "dpo", "--estimate-only", exit_code=2)
    assert "bare size with no architecture" in result.output
