"""Issue 12 item 1, first part: a slice of a few real-width blocks, extrapolated."""

import json

import pytest

from mlxfit import slice as slicing
from mlxfit.measure import measure, request_for
from mlxfit.model import from_folder
from mlxfit.training import TrainingConfig
from tiny_configs import TINY

DEEP = dict(TINY["llama"], hidden_size=128, intermediate_size=256, vocab_size=1024, num_hidden_layers=8, torch_dtype="float32")


def test_slice_config_keeps_widths_and_head():
    sliced = slicing.slice_config(DEEP, 2)
    assert sliced["num_hidden_layers"] == 2 and DEEP["num_hidden_layers"] == 8
    assert {k: v for k, v in sliced.items() if k != "num_hidden_layers"} == {k: v for k, v in DEEP.items() if k != "num_hidden_layers"}
    nested = {"model_type": "gemma3", "text_config": dict(DEEP)}
    assert slicing.slice_config(nested, 1)["text_config"]["num_hidden_layers"] == 1
    with pytest.raises(Exception, match="1 to 8 blocks"):
        slicing.slice_config(DEEP, 9)


def test_models_whose_blocks_differ_are_refused():
    for name in ("qwen3_moe", "gemma3_text"):
        with pytest.raises(slicing.SliceRefused, match="not alike"):
            slicing.plan(dict(TINY[name], num_hidden_layers=8), TrainingConfig(num_layers=-1))
    with pytest.raises(slicing.SliceRefused, match="2 blocks"):
        slicing.plan(TINY["llama"], TrainingConfig(num_layers=-1))


def test_plan_adds_a_frozen_block_only_where_the_run_has_frozen_ones():
    names = lambda t: [s.name for s in slicing.plan(DEEP, t)]  # noqa: E731
    assert names(TrainingConfig(num_layers=-1)) == ["1 trained", "2 trained"]
    assert names(TrainingConfig(num_layers=4)) == ["1 trained", "2 trained", "2 trained + 1 frozen"]


def test_extrapolation_is_the_line_through_the_slices():
    peaks = {slicing.Slice(1, 1): 100, slicing.Slice(2, 2): 130, slicing.Slice(3, 2): 140}
    assert slicing.extrapolate(peaks, trained=4, frozen=0) == 100 + 3 * 30
    assert slicing.extrapolate(peaks, trained=4, frozen=4) == 100 + 3 * 30 + 4 * 10


@pytest.mark.parametrize("training", [
    dict(fine_tune_type="lora", num_layers=-1),
    dict(fine_tune_type="lora", num_layers=4),
    dict(fine_tune_type="full", num_layers=-1),
], ids=["lora-all", "lora-last-4", "full-all"])
def test_slices_predict_the_full_measurement(tmp_path, training):
    """Both measured synchronously: the line through the slices lands near the whole
    8-block run. Seen: lora all -2.5%, lora last 4 -1.2%, full +2.1%. The two-point
    line undershoots LoRA (block 2 adds less than the average block): the issue's
    3% target over 30 configurations is not met yet, so this pins 4%."""
    folder = tmp_path / "deep"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(DEEP))
    run = TrainingConfig(batch_size=2, max_seq_length=128, **training)
    request = request_for(from_folder(folder), run, max_steps=4, min_steps=4)
    whole = measure(dict(request, synchronous=True), timeout=300)
    sliced = slicing.measure_by_slices(request, timeout=300)
    assert sliced.peak_with_load_bytes == pytest.approx(whole.peak_with_load_bytes, rel=0.04)
    data = sliced.to_dict()
    assert data["method"] == "slice" and len(data["slice"]["peaks_bytes"]) == len(data["slice"]["blocks"])
    assert data["slice"]["peak_bytes"] < whole.peak_with_load_bytes
