"""`mlxfit bench`: sweeps, the CSV log and --resume, the --max search, --plot.

Most tests replace the measurement with a fake that answers from the prediction
(instant); two measure a tiny float32 model for real.
"""

import csv
import json
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from mlxfit.cli.bench import bench
from mlxfit.cli.main import cli
from mlxfit.errors import BadInput
from mlxfit.estimate.plan import predict
from mlxfit.measure import bench as lib
from mlxfit.measure.parent import Measurement, MeasurementFailed
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU
from tiny_configs import TINY

cli.add_command(bench)  # as mlxfit/cli/main.py registers it

SMALL = dict(TINY["llama"], hidden_size=128, intermediate_size=256, vocab_size=512, torch_dtype="float32")
HAVE_MATPLOTLIB = True
try:
    import matplotlib  # noqa: F401
except ImportError:
    HAVE_MATPLOTLIB = False


@pytest.fixture
def small(model_folder, platform):
    platform(LINUX_CPU)
    return str(model_folder(SMALL, name="small"))


def run(*args, exit_code=0):
    result = CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    return result


def run_json(*args, exit_code=0):
    return json.loads(run(*args, "--json", exit_code=exit_code).output)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


class FakeMeasure:
    """Stands in for parent.measure: the peak is `scale` × the prediction + `offset`.

    `fail` lists batch sizes whose run dies; after `interrupt_after` calls it
    raises KeyboardInterrupt, as Ctrl-C between two steps would."""

    def __init__(self, scale=1.0, offset=0, fail=(), interrupt_after=None, time_out=()):
        self.scale, self.offset, self.fail, self.interrupt_after = scale, offset, fail, interrupt_after
        self.time_out = time_out  # batch sizes whose run is stopped by --timeout
        self.calls = []

    def peak(self, request):
        from mlxfit.model.resolve import _from_config

        model = _from_config("fake", "local", request["config"])
        return int(self.scale * predict(model, TrainingConfig(**request["training"]), "cpu")[0]) + self.offset

    def __call__(self, request, timeout=None, on_event=lambda e: None, memory_cap=None):
        if self.interrupt_after is not None and len(self.calls) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append(request["training"])
        if request["training"]["batch_size"] in self.fail:
            raise MeasurementFailed("ran out of memory at step 1 after 1.00 GB: the system killed the measuring process (SIGKILL)")
        if request["training"]["batch_size"] in self.time_out:
            raise MeasurementFailed("measurement timed out after 900 s at step 0 (peak so far 3.85 GB); "
                                    "raise --timeout or shrink the run", kind="timeout")
        peak = self.peak(request)
        on_event({"event": "step", "step": 1, "peak_bytes": peak, "seconds": 0.2, "tokens": 1})
        tokens = request["training"]["batch_size"] * (request["length"] - 1)
        return Measurement(
            peak_bytes=peak, peak_with_load_bytes=peak, load_peak_bytes=peak // 2, cache_bytes=0, process_peak_bytes=peak + 10**8,
            steps=3, seconds=0.3, build_seconds=0.1, backend="cpu", step_peaks_bytes=(peak,) * 3,
            step_seconds=(0.2, 0.1, 0.1), tokens_per_step=tokens,
        )


@pytest.fixture
def fake(monkeypatch):
    def use(**kwargs):
        measure = FakeMeasure(**kwargs)
        monkeypatch.setattr("mlxfit.measure.parent.measure", measure)
        return measure

    return use


# --- parsing and combinations ------------------------------------------------


def test_parse_sweep():
    assert lib.parse_sweep("batch_size", "1, 2,4,2") == (1, 2, 4)
    assert lib.parse_sweep("grad_checkpoint", "on,off") == (True, False)
    assert lib.parse_sweep("method", "lora,QLoRA,full") == ("lora", "qlora", "full")
    for name, text, message in [
        ("batch_size", "1,,2", "empty value"),
        ("batch_size", "1,two", "whole numbers"),
        ("grad_checkpoint", "maybe", "takes on,off"),
        ("fine_tune_type", "lora,prefix", "takes lora,dora,full"),
    ]:
        with pytest.raises(BadInput, match=message):
            lib.parse_sweep(name, text)


def test_combinations_follow_probe_and_drop_duplicates(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    model = from_folder(tmp_path)
    base = TrainingConfig(num_layers=-1)
    runs = lib.combinations(model, base, {"method": ("lora", "qlora", "full"), "fine_tune_type": ("lora", "dora")})
    assert [(t.method, t.fine_tune_type) for t in runs] == [
        ("lora", "lora"), ("lora", "dora"), ("qlora", "lora"), ("qlora", "dora"), ("full", "full"),
    ]
    with pytest.raises(BadInput, match="Requested to train 4 layers but the model only has 2 layers"):
        lib.combinations(model, base, {"num_layers": (1, 4)})


# --- sweeps --------------------------------------------------------------------


def test_measured_sweep_csv_and_plot(small, tmp_path):
    """A sweep of batch sizes by lengths on a tiny model, measured for real (six short runs)."""
    out, png = tmp_path / "r.csv", tmp_path / "r.png"
    plot = ["--plot", str(png)] if HAVE_MATPLOTLIB else []
    data = run_json("--model", small, "--num-layers", "-1", "--batch-size", "1,2,4", "--max-seq-length", "128,256",
                    "--steps", "3", "--out", str(out), *plot)
    rows = read_csv(out)
    assert len(rows) == len(data["rows"]) == 6
    assert {(r["batch_size"], r["max_seq_length"]) for r in rows} == {(b, n) for b in "124" for n in ("128", "256")}
    for r in rows:
        assert r["status"] == "measured", r
        assert int(r["predicted_bytes"]) > 0 and int(r["measured_peak_bytes"]) > 0
        assert int(r["process_peak_bytes"]) > int(r["measured_peak_bytes"])
        assert float(r["tokens_per_second"]) > 0 and float(r["seconds_per_step"]) > 0
        # In the right range: on a model this small the fitted framework overhead
        # (a few MB) is a large share of the peak.
        assert abs(int(r["predicted_bytes"]) - int(r["measured_peak_bytes"])) < max(0.35 * int(r["measured_peak_bytes"]), 5e6)
    predicted = [int(r["predicted_bytes"]) for r in rows]
    assert predicted == sorted(predicted)  # run in order of increasing prediction
    assert data["swept"] == {"batch_size": [1, 2, 4], "max_seq_length": [128, 256]}
    if HAVE_MATPLOTLIB:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_output(small, fake):
    fake()
    out = run("--model", small, "--num-layers", "-1", "--batch-size", "1,2", "--rank", "4,8", "--max-seq-length", "64").output
    assert "Fixed" in out and "length 64" in out
    assert "rank" in out and "tok/s" in out and "s/step" in out
    assert out.count("fits") >= 4


def test_over_budget_is_skipped_unless_forced(small, fake, tmp_path):
    model = from_folder(tmp_path / "small")
    need = {b: predict(model, TrainingConfig(num_layers=-1, batch_size=b, max_seq_length=128), "cpu")[0] for b in (1, 2, 4)}
    memory = str((need[2] + need[4]) // 2)  # bytes: 2 fits, 4 does not
    args = ["--model", small, "--num-layers", "-1", "--batch-size", "1,2,4", "--max-seq-length", "128", "--memory", f"{memory}B", "--reserve", "0"]
    measure = fake()
    rows = run_json(*args)["rows"]
    assert [r["status"] for r in rows] == ["measured", "measured", "skipped"]
    assert "exceeds the" in rows[2]["reason"] and len(measure.calls) == 2
    forced = fake()
    assert [r["status"] for r in run_json(*args, "--force")["rows"]] == ["measured"] * 3
    assert len(forced.calls) == 3


def test_a_run_that_dies_is_recorded_and_the_sweep_goes_on(small, fake, tmp_path):
    fake(fail=(2,))
    out = tmp_path / "r.csv"
    rows = run_json("--model", small, "--num-layers", "-1", "--batch-size", "1,2,4", "--max-seq-length", "64", "--out", str(out))["rows"]
    assert [r["status"] for r in rows] == ["measured", "failed", "measured"]
    assert "ran out of memory" in rows[1]["reason"]
    assert [r["status"] for r in read_csv(out)] == ["measured", "failed", "measured"]


def test_estimate_only_measures_nothing(small, fake):
    measure = fake()
    rows = run_json("--model", small, "--num-layers", "-1", "--batch-size", "1,2", "--method", "lora,full", "--estimate-only")["rows"]
    assert len(rows) == 4 and {r["status"] for r in rows} == {"estimated"} and not measure.calls


# --- interruption and --resume -----------------------------------------------------


SWEEP = ["--num-layers", "-1", "--batch-size", "1,2,4", "--max-seq-length", "64,128"]


def test_interrupted_sweep_resumes_with_only_what_is_missing(small, fake, tmp_path):
    out = tmp_path / "r.csv"
    fake(interrupt_after=2)
    first = run_json("--model", small, *SWEEP, "--out", str(out), exit_code=130)
    assert first["interrupted"] and len(first["rows"]) == 2
    assert len(read_csv(out)) == 2  # what was measured is kept

    measure = fake()
    second = run_json("--model", small, *SWEEP, "--out", str(out), "--resume")
    assert len(measure.calls) == 4 and second["resumed"] == 2 and not second["interrupted"]
    rows = read_csv(out)
    keys = [(r["batch_size"], r["max_seq_length"]) for r in rows]
    assert len(rows) == 6 and len(set(keys)) == 6  # every combination once
    assert len(second["rows"]) == 6

    again = fake()
    run_json("--model", small, *SWEEP, "--out", str(out), "--resume")
    assert not again.calls and len(read_csv(out)) == 6


def test_ctrl_c_during_a_measurement_stops_the_sweep(small, fake, tmp_path, monkeypatch):
    """measure() turns Ctrl-C into MeasurementFailed; the sweep must still stop
    and must not record the interrupted run as failed."""
    measure = fake()

    def interrupted(request, **kwargs):
        if measure.calls:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                raise MeasurementFailed("interrupted at step 1; the measuring process was stopped") from None
        return measure(request, **kwargs)

    monkeypatch.setattr("mlxfit.measure.parent.measure", interrupted)
    out = tmp_path / "r.csv"
    data = run_json("--model", small, *SWEEP, "--out", str(out), exit_code=130)
    assert data["interrupted"] and [r["status"] for r in read_csv(out)] == ["measured"]


def test_a_row_cut_off_by_a_kill_is_measured_again(small, fake, tmp_path):
    out = tmp_path / "r.csv"
    fake(interrupt_after=2)
    run_json("--model", small, *SWEEP, "--out", str(out), exit_code=130)
    text = out.read_text()
    out.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 1] + "small,lora,lora,-1,2")  # the second row, half written
    measure = fake()
    run_json("--model", small, *SWEEP, "--out", str(out), "--resume")
    assert len(measure.calls) == 5
    assert len(lib.CsvLog(out).read()) == 6


def test_resume_needs_out_and_matching_columns(small, tmp_path):
    assert "--resume needs --out" in run("--model", small, "--resume", exit_code=2).output
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert "other columns" in run("--model", small, "--num-layers", "-1", "--out", str(other), exit_code=1).output


# --- --max -----------------------------------------------------------------


def budget_for(model, setting, answer, margin=0.1, **training):
    """A --memory size (bytes, reserve 0) whose budget less the margin just holds `answer`."""
    need = predict(model, TrainingConfig(num_layers=-1, **{setting: answer}, **training), "cpu")[0]
    return f"{int(need / (1 - margin)) + 1000}B"


@pytest.mark.parametrize("setting, values, fixed", [
    ("batch_size", range(1, 65), ["--max-seq-length", "128"]),
    ("max_seq_length", range(32, 4097, 32), ["--batch-size", "2"]),
])
def test_max_by_estimate_agrees_with_an_exhaustive_sweep(small, tmp_path, setting, values, fixed):
    model = from_folder(tmp_path / "small")
    extra = {"max_seq_length": 128} if setting == "batch_size" else {"batch_size": 2}
    memory = budget_for(model, setting, 13 * (32 if setting == "max_seq_length" else 1), **extra)
    common = ["--model", small, "--num-layers", "-1", "--memory", memory, "--reserve", "0", "--estimate-only", "--backend", "cpu", *fixed]
    found = run_json(*common, "--max", setting)["max"]
    flag = "--" + setting.replace("_", "-")
    rows = run_json(*common, flag, ",".join(map(str, values)))["rows"]
    target = found["target_bytes"]
    exhaustive = max(r[setting] for r in rows if r["predicted_bytes"] <= target)
    assert found["value"] == exhaustive == 13 * (32 if setting == "max_seq_length" else 1)
    assert found["measured_runs"] == 0


@pytest.mark.parametrize("scale, offset, fail, most_runs", [
    (1.0, 0, (), 1), (0.8, 0, (), 2), (0.5, 0, (), 2), (1.25, 0, (), 2), (2.0, 0, (), 2),
    (1.0, 3_000_000, (), 2), (0.9, -1_000_000, (), 2), (1.0, 0, range(6, 41), 4),
], ids=["exact", "over-estimate", "far-over", "under-estimate", "far-under", "offset", "mixed", "crashes"])
def test_max_measured_agrees_with_an_exhaustive_measured_sweep(small, fake, tmp_path, scale, offset, fail, most_runs):
    model = from_folder(tmp_path / "small")
    memory = budget_for(model, "batch_size", 10, max_seq_length=128)
    common = ["--model", small, "--num-layers", "-1", "--max-seq-length", "128", "--memory", memory, "--reserve", "0", "--backend", "cpu"]
    measure = fake(scale=scale, offset=offset, fail=fail)
    found = run_json(*common, "--max", "batch_size")["max"]
    search_runs = len(measure.calls)
    rows = run_json(*common, "--batch-size", ",".join(map(str, range(1, 41))), "--force")["rows"]
    measured = [r for r in rows if r["status"] == "measured"]
    exhaustive = max((r["batch_size"] for r in measured if r["measured_peak_bytes"] <= found["target_bytes"]), default=None)
    assert found["value"] == exhaustive and found["settled"]
    assert found["measured_runs"] == search_runs <= most_runs
    answer = next(r for r in found["runs"] if r["value"] == found["value"])
    assert found["measured_peak_bytes"] == answer["measured_peak_bytes"] <= found["target_bytes"]


def test_max_measured_for_real(small, tmp_path):
    """A budget that makes the answer small; a couple of real runs confirm it."""
    model = from_folder(tmp_path / "small")
    memory = budget_for(model, "batch_size", 3, max_seq_length=64)
    found = run_json("--model", small, "--num-layers", "-1", "--max-seq-length", "64", "--memory", memory,
                     "--reserve", "0", "--backend", "cpu", "--max", "batch_size", "--steps", "3")["max"]
    assert found["estimate_value"] == 3 and found["measured"] and 1 <= found["measured_runs"] <= 3
    by_value = {r["value"]: r for r in found["runs"]}
    assert by_value[found["value"]]["fits"]
    assert by_value[found["value"]]["measured_peak_bytes"] <= found["target_bytes"]
    if found["value"] + 1 in by_value:
        assert not by_value[found["value"] + 1]["fits"]
    text = run("--model", small, "--num-layers", "-1", "--max-seq-length", "64", "--memory", memory,
               "--reserve", "0", "--backend", "cpu", "--max", "batch_size", "--estimate-only").output
    assert "Largest batch size that fits" in text and ": 3" in text


def test_largest_searches_by_doubling_then_bisection():
    calls = []

    def fits(v):
        calls.append(v)
        return v <= 1000

    assert lib.largest(fits, 1) == 1000 and len(calls) < 25
    assert lib.largest(lambda v: v <= 1000, 32) == 992
    assert lib.largest(lambda v: False, 1) is None


@pytest.mark.parametrize("args, message", [
    (["--max", "batch_size", "--batch-size", "4"], "leave --batch-size out"),
    (["--max", "batch_size", "--rank", "8,16"], "give the others one value each"),
    (["--max", "max-seq-length", "--plot", "x.png"], "--plot is for sweeps"),
])
def test_max_usage_errors(small, args, message):
    assert message in run("--model", small, *args, exit_code=2).output


# --- plot ---------------------------------------------------------------------


def test_plot_with_skipped_and_failed_runs(small, fake, tmp_path):
    pytest.importorskip("matplotlib")
    fake(fail=(2,))
    png = tmp_path / "p.png"
    model = from_folder(tmp_path / "small")
    memory = budget_for(model, "batch_size", 4, margin=0.0, max_seq_length=64)
    run("--model", small, "--num-layers", "-1", "--batch-size", "1,2,4,8", "--max-seq-length", "64",
        "--memory", memory, "--reserve", "0", "--backend", "cpu", "--plot", str(png))
    assert png.stat().st_size > 10_000


def test_plot_without_matplotlib_is_one_line(small, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(cli, ["bench", "--model", small, "--plot", "x.png"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --plot needs matplotlib: pip install 'mlxfit[plot]'"


def test_importing_the_command_stays_light():
    code = (
        "import sys\n"
        "import mlxfit.cli.bench\n"
        "heavy = ('mlx_lm', 'transformers', 'matplotlib')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in ('mlxfit.measure.bench', 'mlxfit.render.bench')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- what bench knows: timeouts are unknown, logs get a line per step ------------


def test_a_timed_out_run_is_unknown_never_does_not_fit(small, fake, tmp_path):
    """A step-0 timeout with 3.85 GB seen was reported as "does not fit"."""
    fake(time_out=(2,))
    out = tmp_path / "r.csv"
    args = ["--model", small, "--num-layers", "-1", "--batch-size", "1,2,4", "--max-seq-length", "64", "--out", str(out)]
    rows = run_json(*args, exit_code=lib.EXIT_UNKNOWN)["rows"]
    assert [r["status"] for r in rows] == ["measured", "unknown", "measured"]
    assert rows[1]["measured_fits"] is None and "timed out" in rows[1]["reason"]
    assert [r["status"] for r in read_csv(out)] == ["measured", "unknown", "measured"]
    again = fake()
    run(*args, "--resume")  # an unknown row is measured again, the others stand
    assert [c["batch_size"] for c in again.calls] == [2]


def test_max_stops_at_a_timeout_and_says_the_limit_is_unknown(small, fake, tmp_path):
    model = from_folder(tmp_path / "small")
    memory = budget_for(model, "batch_size", 10, max_seq_length=128)
    common = ["--model", small, "--num-layers", "-1", "--max-seq-length", "128", "--memory", memory, "--reserve", "0", "--max", "batch_size"]
    fake(time_out=range(1, 100))
    found = run_json(*common, exit_code=lib.EXIT_UNKNOWN)["max"]
    assert found["value"] is None and found["unknown"] and not found["settled"]
    assert [r["fits"] for r in found["runs"]] == [None]
    text = run(*common, exit_code=lib.EXIT_UNKNOWN).output
    assert "Unknown" in text and "timed out" in text and "does not fit" not in text
    fake(time_out=range(11, 100), scale=0.5)  # the estimate is 2x high: the search goes up and times out
    found = run_json(*common, exit_code=lib.EXIT_UNKNOWN)["max"]
    assert found["unknown"] and found["value"] >= 10
    assert found["runs"][-1]["fits"] is None and all(r["fits"] for r in found["runs"][:-1])


def test_without_a_terminal_each_step_is_a_line(small, fake):
    fake()
    result = CliRunner().invoke(cli, ["bench", "--model", small, "--num-layers", "-1", "--batch-size", "1,2", "--max-seq-length", "64"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    steps = [line for line in result.stderr.splitlines() if "step 1: peak" in line]
    assert len(steps) == 2 and "batch 1" in steps[0] and "batch 2" in steps[1]


def test_measuring_against_a_hypothetical_budget_says_so_first(small, fake):
    fake()
    args = ["--model", small, "--num-layers", "-1", "--batch-size", "1", "--max-seq-length", "64", "--memory", "16GB"]
    flat = " ".join(run(*args).output.split())  # rich wraps long lines
    assert "measured on this machine" in flat and "hypothetical budget of 12.00 GB" in flat, flat
    assert flat.index("hypothetical budget") < flat.index("predicted")  # up front, before any result
    assert run_json(*args)["notes"] and not run_json(*args, "--estimate-only")["notes"]
    assert "hypothetical budget" not in run(*args, "--estimate-only").output


# --- runs over what this machine can hold: measured by slice --------------------

SMALL4 = dict(SMALL, num_hidden_layers=4)  # deep enough to slice (slices of 1 and 2 blocks)


@pytest.fixture
def small4(model_folder, platform):
    """A machine whose 30 MB budget holds a 4-block run at batch 1 (~14 MB) but not at 4 (~38 MB)."""
    import dataclasses

    platform(dataclasses.replace(LINUX_CPU, system_total=40 * 10**6, system_used=0, system_available=40 * 10**6))
    return str(model_folder(SMALL4, name="small4"))


def test_a_sweep_measures_by_slice_what_this_machine_cannot_hold(small4):
    """Against a hypothetical budget larger than this machine, a run predicted over
    what this machine can hold is measured by slice (for real), the others whole."""
    data = run_json("--model", small4, "--num-layers", "-1", "--batch-size", "1,4", "--max-seq-length", "128",
                    "--memory", "200MB")
    rows = {row["batch_size"]: row for row in data["rows"]}
    assert [rows[b]["measured_by"] for b in (1, 4)] == ["full", "slice"]
    assert all(row["status"] == "measured" for row in rows.values())
    assert rows[4]["reason"].startswith("extrapolated from slices of 1 trained; 3 trained; 2 trained run ahead as mlx-lm runs, of the 4 blocks")
    assert rows[4]["measured_peak_bytes"] > rows[1]["measured_peak_bytes"]
    assert "measured by slice" in data["notes"][0]


def test_max_measures_by_slice_the_candidates_this_machine_cannot_hold(small4, fake, monkeypatch):
    from dataclasses import replace

    full = fake()
    sliced = []

    def by_slice(model, training, length, max_steps, timeout=None, on_event=lambda e: None):
        sliced.append(training.batch_size)
        m = full({"config": model.config, "training": training.to_dict(), "length": training.max_seq_length})
        return replace(m, method="slice", slice={"how": "slices"})

    monkeypatch.setattr("mlxfit.measure.slicing.measure_by_slices", by_slice)
    data = run_json("--model", small4, "--num-layers", "-1", "--max-seq-length", "128", "--max", "batch_size",
                    "--memory", "200MB")
    runs = data["max"]["runs"]
    local_usable = 30 * 10**6
    assert runs and sliced, runs
    for r in runs:
        assert r["measured_by"] == ("slice" if r["predicted_bytes"] > local_usable else "full"), r


# --- a full disk: what was measured is never lost, nothing is half-written -----------


def _disk_full_after(monkeypatch, target, good_writes):
    """The disk fills while `target` is written for the (good_writes + 1)th time: half
    its bytes reach the file, then the write fails as a full disk fails it."""
    import errno

    from mlxfit import files

    real, seen = files.write_atomically, []

    def filling(path, write):
        if str(path) != str(target):
            return real(path, write)
        seen.append(path)
        if len(seen) <= good_writes:
            return real(path, write)

        def half(f):
            import io

            buffer = io.BytesIO()
            write(buffer)
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        return real(path, half)

    monkeypatch.setattr(files, "write_atomically", filling)


def test_a_full_disk_under_out_keeps_every_row_measured(small, fake, tmp_path, monkeypatch):
    out = tmp_path / "r.csv"
    _disk_full_after(monkeypatch, out, good_writes=2)
    fake()
    result = CliRunner().invoke(cli, ["bench", "--model", small, *SWEEP, "--out", str(out), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert len(data["rows"]) == 3  # the two written and the one whose write failed
    assert len(read_csv(out)) == 2  # the file holds the rows written before, whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left
    assert result.stderr.startswith("Error: --out") and "No space left on device" in result.stderr
    assert "--resume" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_disk_full_from_the_start_leaves_no_file_and_says_no_row_was_written(small, fake, tmp_path, full_disk):
    results = tmp_path / "results"
    results.mkdir()
    out = results / "r.csv"
    full_disk(results)
    fake()
    result = CliRunner().invoke(cli, ["bench", "--model", small, *SWEEP, "--out", str(out), "--json"])
    assert result.exit_code == 1, result.output
    assert len(json.loads(result.stdout)["rows"]) == 1  # measured, shown, but written nowhere
    assert list(results.iterdir()) == []  # no r.csv, no temporary file
    assert result.stderr.strip() == (
        f"Error: --out {out}: cannot write (No space left on device), so the sweep stopped after 1 of 6; "
        f"the rows above are every one measured, and none of them could be written to {out}"
    )


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="needs mlxfit[plot]")
def test_a_full_disk_under_plot_leaves_no_temporary_png(small, fake, tmp_path, full_disk):
    out, plots = tmp_path / "r.csv", tmp_path / "plots"
    plots.mkdir()
    full_disk(plots)
    fake()
    result = CliRunner().invoke(cli, ["bench", "--model", small, *SWEEP, "--out", str(out), "--plot", str(plots / "r.png")])
    assert result.exit_code == 1, result.output
    assert list(plots.iterdir()) == [] and len(read_csv(out)) == 6
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: --plot {plots / 'r.png'}: cannot write (No space left on device); the rows above are every one "
        f"measured, and they are in {out}"
    )


@pytest.mark.skipif(not HAVE_MATPLOTLIB, reason="needs mlxfit[plot]")
def test_a_full_disk_under_plot_keeps_the_results_and_leaves_no_empty_png(small, fake, tmp_path, monkeypatch):
    out, png = tmp_path / "r.csv", tmp_path / "r.png"
    _disk_full_after(monkeypatch, png, good_writes=0)
    fake()
    result = CliRunner().invoke(cli, ["bench", "--model", small, *SWEEP, "--out", str(out), "--plot", str(png)])
    assert result.exit_code == 1, result.output
    assert not png.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(read_csv(out)) == 6 and "measured" in result.stdout
    last = result.stderr.strip().splitlines()[-1]  # after the progress lines
    assert last.startswith("Error: --plot") and "No space left on device" in last


def test_method_and_type_that_disagree_are_refused_as_in_probe():
    out = run("-m", "Qwen/Qwen3-0.6B", "--method", "qlora", "--fine-tune-type", "full", "--estimate-only",
              "--memory", "16GB", exit_code=2).output
    assert "--method qlora conflicts with --fine-tune-type full" in out


def test_a_type_that_the_methods_vary_is_not_called_fixed():
    """--method full,qlora over one --fine-tune-type dora runs a full fine-tune and a QDoRA:
    the header named the first's type as fixed for both."""
    out = run("-m", "Qwen/Qwen3-0.6B", "--method", "full,qlora", "--fine-tune-type", "dora", "--estimate-only",
              "--memory", "16GB").output
    fixed = next(line for line in out.splitlines() if line.startswith("Fixed"))
    assert "type" not in fixed


def test_max_by_estimate_says_when_probe_would_call_the_answer_tight():
    """The margin is taken from the point estimate; probe judges the range against the whole
    budget. When the two differ, the answer says so instead of calling the run plainly fitting."""
    data = run_json("-m", "Qwen/Qwen3-0.6B", "--estimate-only", "--max", "batch_size", "--memory", "32GB",
                    "--max-seq-length", "1024")["max"]
    assert data["estimate_verdict"] == "tight"
    out = run("-m", "Qwen/Qwen3-0.6B", "--estimate-only", "--max", "batch_size", "--memory", "32GB",
              "--max-seq-length", "1024").output
    assert "probe calls it tight" in out and "Measured:" not in out


def test_lengths_past_the_models_context_are_refused_or_never_searched(model_folder, platform):
    """probe refuses a --max-seq-length past max_position_embeddings; bench took it, and --max
    could answer a length no run may use."""
    platform(LINUX_CPU)
    short = str(model_folder(dict(SMALL, max_position_embeddings=512), name="short"))
    common = ["--model", short, "--num-layers", "-1", "--batch-size", "1", "--estimate-only", "--memory", "100GB"]
    assert "past" in run(*common, "--max-seq-length", "1024", exit_code=2).output
    found = run_json(*common, "--max", "max_seq_length")["max"]
    assert found["value"] == 512


def test_force_without_measuring_is_refused():
    out = run("-m", "Qwen/Qwen3-0.6B", "--estimate-only", "--force", "--memory", "16GB", exit_code=2).output
    assert "--force measures combinations" in out


def test_without_a_terminal_each_finished_row_is_one_line_written_at_once(platform, rates_in_cache):
    """Piped (a log, CI), bench writes each finished row as one line the moment it finishes: the
    first row's line arrives while the second run is still measuring, not at exit."""
    import os
    from pathlib import Path

    platform(LINUX_CPU)
    rates_in_cache("float32")  # tiny-llama's dtype: the command reads them instead of timing them
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-m", "mlxfit", "bench", "-m", str(root / "examples" / "tiny-llama"),
                             "--num-layers", "-1", "--batch-size", "1,2", "--max-seq-length", "32", "--steps", "3"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks = []
    while chunk := os.read(proc.stderr.fileno(), 1 << 16):
        chunks.append(chunk.decode())
    assert proc.wait(timeout=300) == 0, "".join(chunks)
    proc.stdout.close()
    proc.stderr.close()
    first = next(i for i, c in enumerate(chunks) if "[1/2]" in c)
    assert "[2/2]" not in "".join(chunks[: first + 1])  # written before the second run finished
    rows = [line for line in "".join(chunks).splitlines() if line.startswith("  [")]
    assert len(rows) == 2 and all(line.endswith("fits") for line in rows), rows  # one line each, unwrapped


def test_an_estimated_row_is_judged_on_probes_range_with_what_it_spans():
    """On Metal the range spans the fused cross-entropy and its absence (estimate/unverified.py):
    bench's estimated rows and its --max search judge that range, as probe does."""
    from mlxfit.estimate.plan import predict
    from mlxfit.estimate.sizing import run_range
    from mlxfit.measure.bench.sweep import plan_sweep
    from mlxfit.model.resolve import resolve_model
    from mlxfit.model.training import TrainingConfig

    model = resolve_model("Qwen/Qwen3-1.7B")
    training = TrainingConfig(batch_size=4, max_seq_length=2048)
    need, breakdown = predict(model, training, "metal")
    (planned,) = plan_sweep(model, [training], 10**12, "metal", measure_runs=False)
    assert planned.predicted_range_bytes == run_range(need, training, "metal", breakdown)
    assert planned.predicted_range_bytes[1] > run_range(need, training, "metal")[1]  # the span widens it
