"""A stored measurement corrects only estimates of the same
architecture at close settings (one measurement of the 4M example used to shift
a 7B's estimate)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate import calibration as store
from mlxfit.estimate.plan import predict
from mlxfit.model.resolve import from_folder, resolve_model
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU

TINY = Path(__file__).parent.parent / "examples" / "tiny-llama"
RUN = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=256)
GAP = 5_000_000


def _measured(model, training, gap=GAP, architecture=True):
    predicted = predict(model, training, "cpu")[0]
    measured = {"peak_with_load_bytes": predicted + gap, "peak_bytes": predicted + gap}
    store.record(model.id, training.to_dict(), "cpu", predicted, measured,
                 architecture=store.architecture_key(model) if architecture else None)
    return predicted


def test_a_measurement_corrects_its_own_run():
    tiny = from_folder(TINY)
    raw = _measured(tiny, RUN)
    found = store.calibration("cpu", tiny, RUN)
    assert (found.offset_bytes, found.count) == (GAP, 1)
    assert predict(tiny, RUN, "cpu", found)[0] == raw + GAP


def test_other_architectures_and_settings_stay_uncorrected():
    tiny = from_folder(TINY)
    _measured(tiny, RUN)
    seven_b = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    assert store.calibration("cpu", seven_b, RUN) is None
    everything = store.calibration("cpu", tiny)
    assert everything.offset_for(seven_b, RUN) is None  # a 7B is not the 4M example
    far = [
        replace(RUN, batch_size=8),  # 4x the tokens per step
        replace(RUN, fine_tune_type="full"),
        replace(RUN, quantize=True),
        replace(RUN, grad_checkpoint=True),
        replace(RUN, rank=16),
        replace(RUN, num_layers=2),
        replace(RUN, optimizer="sgd"),
    ]
    for training in far:
        assert everything.offset_for(tiny, training) is None, training
        assert predict(tiny, training, "cpu", everything)[0] == predict(tiny, training, "cpu")[0]
    near = replace(RUN, max_seq_length=384)  # 1.5x the tokens: close enough
    assert everything.offset_for(tiny, near) == GAP


def test_measurements_stored_without_their_architecture_correct_nothing():
    tiny = from_folder(TINY)
    _measured(tiny, RUN, architecture=False)
    assert store.calibration("cpu", tiny, RUN) is None


def test_probe_of_a_7b_ignores_the_example_measurement(platform):
    platform(LINUX_CPU)
    _measured(from_folder(TINY), RUN)
    runner = CliRunner()
    args = ["--num-layers", "-1", "--batch-size", "2", "--max-seq-length", "256", "--json"]
    big = json.loads(runner.invoke(cli, ["probe", "--model", "Qwen/Qwen2.5-7B-Instruct", *args], catch_exceptions=False).output)
    assert big["calibration"] is None
    small = json.loads(runner.invoke(cli, ["probe", "--model", str(TINY), *args], catch_exceptions=False).output)
    assert small["calibration"] == {"offset_bytes": GAP, "measurements": 1}


# -- evidence from users: calibration --export and benchmarks/mac_evidence.py --------------------


def _mac_evidence():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import mac_evidence

    return mac_evidence


def test_clear_with_export_deletes_nothing(tmp_path):
    """Both at once used to export and silently skip the clear; now neither happens before the
    user says which comes first."""
    model = resolve_model("Qwen/Qwen3-0.6B")
    store.record(model.id, TrainingConfig().to_dict(), "cpu", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(model))
    result = CliRunner().invoke(cli, ["calibration", "--clear", "--export", str(tmp_path / "x.csv")])
    assert result.exit_code == 2 and "export first" in result.output
    assert len(store.stored()) == 1 and not (tmp_path / "x.csv").exists()


def test_export_round_trips_into_the_evidence_without_user_paths(tmp_path):
    """A stored Metal measurement, exported as an evidence row, is read back by
    benchmarks/mac_evidence.py as the same run (model, settings, width, peak, versions), and
    the file names no place on this machine, not even a local model's folder."""
    import csv

    from mlxfit.estimate.export import EVIDENCE_COLUMNS

    ev = _mac_evidence().ev

    catalog = resolve_model("Qwen/Qwen3-0.6B")
    t_catalog = TrainingConfig(batch_size=2, max_seq_length=1024, grad_checkpoint=True)
    local = from_folder(TINY)
    t_local = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=256)
    machine = {"device_name": "Apple M4 Pro", "total_bytes": 48 * 10**9}
    for model, t, width, peak in ((catalog, t_catalog, 513, 3_123_456_789), (local, t_local, 129, 45_678_901)):
        predicted = predict(model, t, "metal", length=width)[0]
        store.record(model.id, t.to_dict(), "metal", predicted,
                     {"peak_with_load_bytes": peak, "peak_bytes": peak - 1000, "steps": 3},
                     architecture=store.architecture_key(model), length=width, machine=machine,
                     config=model.config if model.source == "local" else None)
    store.record(catalog.id, t_catalog.to_dict(), "cpu", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(catalog))

    out = tmp_path / "mine.csv"
    result = CliRunner().invoke(cli, ["calibration", "--export", str(out)], catch_exceptions=False)
    assert result.exit_code == 0 and "Wrote 3 stored measurements" in result.output
    text = out.read_text()
    assert str(TINY) not in text and str(Path.home()) not in text and str(tmp_path) not in text
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0])[: len(EVIDENCE_COLUMNS)] == list(EVIDENCE_COLUMNS)  # the public files' columns first

    runs, skipped = ev.user_runs(out)
    assert len(runs) == 2 and list(skipped.values()) == ["measured on the cpu backend, not a GPU"]
    by_width = {r.lengths()[0]: r for r in runs}
    run = by_width[513]
    assert run.model == "Qwen/Qwen3-0.6B" and run.peak_gb == 3.123 and run.exact_length and run.kind == "lora-ckpt"
    assert run.training_config() == t_catalog and run.mlx == store.versions()["mlx"]
    assert by_width[129].model.startswith("local llama")
    me = _mac_evidence()
    for r in runs:
        model, width = (catalog, 513) if r is run else (local, 129)
        case = me.Case(r)
        expected = predict(model, r.training_config(), "metal", length=width, runtime=ev.run_runtime(r))[0]
        assert abs(case.predicted(*me.vector(me.coefficients()["metal"]))[0] - expected) <= 64  # int rounding of parts
    assert any(r.key.startswith("user mine.csv") for r in me.evidence_runs([out])[0])


def test_calibration_shows_a_long_model_path_in_full_at_80_columns(tmp_path):
    """The table used to cut every model to its first 14 characters ("/home/me/mlxf…")."""
    folder = tmp_path / "projects" / "fine-tuning-experiments" / "models" / "tiny-llama-with-a-long-name"
    model = resolve_model("Qwen/Qwen3-0.6B")
    store.record(str(folder), RUN.to_dict(), "cpu", 123_456_789, {"peak_with_load_bytes": 234_567_890, "steps": 3},
                 architecture=store.architecture_key(model), source="local")
    store.record(model.id, RUN.to_dict(), "cpu", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(model))
    result = CliRunner().invoke(cli, ["calibration"], env={"COLUMNS": "80"}, catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert "…" not in result.output and max(len(line) for line in lines) <= 80
    assert str(folder) in "".join(lines)  # whole, folded onto further lines where longer than the terminal
    assert "Qwen/Qwen3-0.6B" in lines and "234.6 MB" in result.output


def test_export_anonymises_relative_model_folders_too(tmp_path, monkeypatch):
    """A folder given relative to the working directory ("models/my-llama") is a path on this
    machine as much as an absolute one; Hub ids stay."""
    import shutil

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    shutil.copytree(TINY, tmp_path / "models" / "my-llama")
    local = resolve_model("models/my-llama")
    assert local.id == "models/my-llama" and local.source == "local"
    _store = dict(architecture=store.architecture_key(local), config=local.config, source=local.source)
    store.record(local.id, RUN.to_dict(), "metal", 1, {"peak_with_load_bytes": 2, "steps": 3}, **_store)
    # as bench stores it (no config), and as measurements from before the source was stored
    store.record(local.id, replace(RUN, rank=4).to_dict(), "metal", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(local), source="local")
    store.record("my-llama", replace(RUN, rank=2).to_dict(), "metal", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(local))
    hub = resolve_model("Qwen/Qwen3-0.6B")
    store.record(hub.id, RUN.to_dict(), "metal", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(hub), source=hub.source)
    out = tmp_path / "mine.csv"
    result = CliRunner().invoke(cli, ["calibration", "--export", str(out)], catch_exceptions=False)
    assert result.exit_code == 0 and "Wrote 4 stored measurements" in result.output
    text = out.read_text()
    assert "my-llama" not in text and "models/" not in text
    assert "Qwen/Qwen3-0.6B" in text and text.count("local llama") == 3


def test_a_stored_step_time_corrects_later_time_estimates_here(monkeypatch, platform):
    """A measurement stored with its pace scales the time of later runs of the same architecture on
    this machine by measured over predicted step (the nearest stored run's), and the answer says so;
    another machine (--memory) or a run at other rates (QLoRA) stays uncorrected."""
    import mlxfit.measure.rate as rate
    from mlxfit.estimate import step_time as st

    platform(LINUX_CPU)  # a cpu machine, as the measurements below were stored
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: rate.MachineRates(1e10, 1e10, 3e7, 1e-5))
    tiny = from_folder(TINY)
    speed = st.measured_speed(rate.machine_rates("float32"))
    predicted = st.step_time(tiny, RUN, speed).seconds
    far = replace(RUN, batch_size=8)  # the nearest of the two stored below: same settings, 4x the tokens
    store.record(tiny.id, RUN.to_dict(), "cpu", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(tiny),
                 time={"tokens_per_second": 1000.0, "step_seconds": 3 * predicted, "predicted_step_seconds": predicted})
    store.record(tiny.id, replace(RUN, grad_checkpoint=True).to_dict(), "cpu", 1, {"peak_with_load_bytes": 2, "steps": 3},
                 architecture=store.architecture_key(tiny),
                 time={"tokens_per_second": 10.0, "step_seconds": 100 * predicted, "predicted_step_seconds": predicted})

    found = store.calibration("cpu", tiny)
    corrected = store.speed_corrected(speed, found, tiny, far)
    assert corrected.correction["factor"] == 3.0 and corrected.correction["batch_size"] == 2
    assert st.step_time(tiny, far, corrected).seconds / st.step_time(tiny, far, speed).seconds == pytest.approx(3)
    assert store.speed_corrected(speed, found, tiny, replace(far, quantize=True)) is speed  # other rates

    def probe(*extra):
        result = CliRunner().invoke(cli, ["probe", str(TINY), "--num-layers", "-1", "--batch-size", "8",
                                          "--max-seq-length", "256", *extra])
        assert result.exit_code == 0, result.output
        return result.output

    out = json.loads(probe("--json"))
    assert out["time"]["corrected_by"]["factor"] == 3.0
    text = " ".join(probe().split())
    assert "corrected by your measurement of 1,000 tokens/s (batch 2 × 256 tokens" in text
    assert "3.00× the estimate at this machine's rates" in text
    assert "corrected_by" not in json.loads(probe("--json", "--memory", "192GB"))["time"]  # another machine


def test_measure_stores_its_pace_with_the_measurement(platform):
    platform(LINUX_CPU)
    result = CliRunner().invoke(cli, ["probe", str(TINY), "--num-layers", "-1", "--batch-size", "1",
                                      "--max-seq-length", "64", "--measure", "--steps", "3", "--json"])
    assert result.exit_code == 0, result.output
    (entry,) = store.stored()
    pace = entry["time"]
    assert pace["tokens_per_second"] > 0 and pace["step_seconds"] > 0 and pace["predicted_step_seconds"] > 0
    assert json.loads(result.output)["time"]["measured"]["tokens_per_second"] == pace["tokens_per_second"]


def test_export_carries_the_measured_pace(tmp_path):
    """Each exported row carries the throughput with the chip it ran on (mac_throughput.csv's
    columns), so a user's run is evidence for the time estimate too; a slice's pace is not the run's."""
    import csv

    tiny = from_folder(TINY)
    machine = {"device_name": "Apple M4 Pro", "total_bytes": 48 * 10**9}
    common = dict(architecture=store.architecture_key(tiny), machine=machine, config=tiny.config, source="local")
    store.record(tiny.id, RUN.to_dict(), "metal", 1, {"peak_with_load_bytes": 2, "steps": 3, "tokens_per_second": 2048.0},
                 time={"tokens_per_second": 2048.0, "step_seconds": 0.25, "predicted_step_seconds": 0.2}, **common)
    store.record(tiny.id, replace(RUN, rank=4).to_dict(), "metal", 1,
                 {"peak_with_load_bytes": 2, "steps": 3, "tokens_per_second": 99.0, "slice": {"blocks": 2}}, **common)
    out = tmp_path / "mine.csv"
    assert CliRunner().invoke(cli, ["calibration", "--export", str(out)]).exit_code == 0
    rows = {r["rank"]: r for r in csv.DictReader(open(out))}
    whole, sliced = rows["8"], rows["4"]
    assert (whole["chip"], whole["tokens_per_step"], whole["tokens_per_sec"], whole["step_seconds"]) == (
        "Apple M4 Pro", "512", "2048.0", "0.2500")
    assert (sliced["tokens_per_sec"], sliced["step_seconds"]) == ("", "")
