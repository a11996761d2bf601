"""Issue 12 item 4: a stored measurement corrects only estimates of the same
architecture at close settings (one measurement of the 4M example used to shift
a 7B's estimate)."""

import json
from dataclasses import replace
from pathlib import Path

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
