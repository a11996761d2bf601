"""probe of a vision-language model end to end (mlx-vlm): the answer's parts and images,
its JSON in the one shape, --data of images, --measure against mlx-vlm's own trainer,
bad input in one line, and the line without mlx-vlm."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("mlx_vlm")

import tiny_vlms  # noqa: E402
from mlxfit.cli.main import cli  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlm") / "qwen2_vl"
    tiny_vlms.write_model(folder, "qwen2_vl")
    return folder


def probe(*args):
    return CliRunner().invoke(cli, ["probe", *map(str, args)])


def test_the_answer_shows_the_parts_images_and_verdict(qwen):
    r = probe(qwen, "--memory", "16GB", "--image-size", "448x448", "--images-per-example", "2", "-v")
    assert r.exit_code == 0, r.output
    assert "mlx_vlm.train lora" in r.output
    assert "2 per example of 448x448" in r.output and "512 image tokens per example" in r.output
    assert "vision tower" in r.output and "language model (block)" in r.output and "cached rows" in r.output
    assert re.search(r"Verdict\s+fits", r.output)


def test_json_has_the_shape_of_every_answer(qwen):
    sft = json.loads(probe(ROOT / "examples" / "tiny-llama", "--num-layers", "4", "--memory", "16GB", "--json").output)
    r = probe(qwen, "--memory", "16GB", "--json")
    d = json.loads(r.output)
    assert set(d) == set(sft)
    e = d["estimate"]
    assert e["predicted_peak_bytes"] == max(p["bytes"] for p in e["phases"])
    assert {p["name"] for p in e["phases"]} >= {"vision tower", "language model (loss)", "optimizer update"}
    assert d["run"]["command"] == "mlx_vlm.train" and d["run"]["image_size_is_default"]
    # a 1024x768 photo, each side rounded to a multiple of 28 (smart_resize): 1036 / 28 x 756 / 28 tokens
    assert d["run"]["image_tokens"] == 37 * 27 and d["verdict"] == "fits"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_model_s_dtype_is_named_as_its_config_names_it(tmp_path, dtype):
    """bfloat16 and float16 are both 2 bytes: the name is the checkpoint's, not read off its width."""
    folder = tmp_path / "qwen2_vl"
    config = tiny_vlms.write_model(folder, "qwen2_vl")
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
    d = json.loads(probe(folder, "--memory", "16GB", "--json").output)
    assert d["model"]["dtype"] == dtype and d["model"]["bits"] == (32 if dtype == "float32" else 16)
    r = probe(folder, "--memory", "16GB")
    assert r.exit_code == 0 and dtype in r.output.split("Run")[0]


@pytest.mark.parametrize("size", ["12by3", "0x10", "448"])
def test_a_bad_image_size_is_one_line(qwen, size):
    r = probe(qwen, "--image-size", size)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: --image-size")


def test_image_flags_of_a_text_model_are_refused(qwen):
    r = probe(ROOT / "examples" / "tiny-llama", "--image-size", "448x448")
    assert r.exit_code == 2 and "no vision part" in r.output


def test_data_of_images_says_which_rows_mlx_vlm_would_refuse(qwen, tmp_path):
    data = tiny_vlms.write_data(tmp_path / "data", (448, 448), images=1, rows=2)
    d = json.loads(probe(qwen, "--data", data, "--max-seq-length", "200", "--json").output)
    assert d["data"]["refused_rows"] == [1, 2]  # 256 image tokens cannot fit in 200
    r = probe(qwen, "--data", data)
    assert r.exit_code == 0 and "256 image" in r.output


def test_measure_agrees_with_mlx_vlms_trainer(qwen, tmp_path, monkeypatch):
    tiny_vlms.write_data(tmp_path / "data", (448, 448), images=1, rows=2)
    monkeypatch.chdir(tmp_path)  # relative paths, as typed: the child runs in a folder of its own
    d = json.loads(probe(qwen, "--data", "data", "--measure", "--json").output)
    m = d["measured"]
    assert m["steps"] == 3 and m["vision_tokens"] == [256] * 3
    assert abs(m["error"]) < 0.15


def test_without_mlx_vlm_one_line_names_the_extra(qwen, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlx_vlm" else real(name, *a))
    r = probe(qwen)
    assert r.exit_code == 1 and "mlxfit[vlm]" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_the_range_holds_every_measured_run():
    """estimate/vision.py's EVIDENCE spans measured / predicted of benchmarks/results/vision.md."""
    from mlxfit.estimate.vision import EVIDENCE

    rows = re.findall(r"\| ([\d.]+) \| ([\d.]+) \| [+-][\d.]+% \|$", (ROOT / "benchmarks/results/vision.md").read_text(), re.M)
    ratios = [float(m) / float(p) for p, m in rows]
    assert len(ratios) >= 35
    assert EVIDENCE[0] <= min(ratios) and max(ratios) <= EVIDENCE[1]
    assert min(ratios) - EVIDENCE[0] < 0.01 and EVIDENCE[1] - max(ratios) < 0.01


def test_train_vision_and_cache_size_are_mlx_vlm_trains_flags():
    """Both exist in mlx_vlm.train's parser with these names: --train-vision off, --cache-size 32,
    "none" read as no limit."""
    from mlx_vlm.train import build_parser

    parser = build_parser()
    defaults = vars(parser.parse_args(["--model", "x"]))
    assert defaults["train_vision"] is False and defaults["cache_size"] == 32
    given = vars(parser.parse_args(["--model", "x", "--train-vision", "--cache-size", "none"]))
    assert given["train_vision"] is True and given["cache_size"] is None
    assert vars(parser.parse_args(["--model", "x", "--cache-size", "4"]))["cache_size"] == 4


def test_train_vision_and_cache_size_change_the_answer_and_its_json(qwen):
    base = json.loads(probe(qwen, "--image-size", "448x448", "--json").output)
    trained = json.loads(probe(qwen, "--image-size", "448x448", "--train-vision", "--cache-size", "4", "--json").output)
    assert base["run"]["training"]["train_vision"] is False and base["run"]["training"]["cache_size"] == 32
    assert trained["run"]["training"]["train_vision"] is True and trained["run"]["training"]["cache_size"] == 4
    cached = {p["name"]: p["breakdown"]["cached rows (pixels)"] for p in trained["estimate"]["phases"]}
    assert set(cached.values()) == {4 * 1024 * 1176 * 4}  # 4 rows of 1024 patches x 1176 float32 values
    r = probe(qwen, "--image-size", "448x448", "--train-vision", "--cache-size", "none")
    assert r.exit_code == 0, r.output
    assert "vision tower trained (--train-vision)" in r.output and "cache every row (--cache-size)" in r.output
    assert "counted as 32 rows" in r.output


@pytest.mark.parametrize("value", ["-1", "many", "2.5"])
def test_a_bad_cache_size_is_one_line(qwen, value):
    r = probe(qwen, "--cache-size", value)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert f"--cache-size {value}: give the processed rows" in r.output


def test_train_vision_on_a_model_without_images_is_refused():
    r = probe(ROOT / "examples" / "tiny-llama", "--train-vision")
    assert r.exit_code != 0 and "--train-vision is for vision-language models" in r.output


def _json(*args) -> dict:
    r = probe(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_plans_for_images_are_each_re_estimated(qwen, tmp_path):
    """A run that does not fit gets changes for its images, each the estimate of the run it
    makes: the max_pixels cap is the answer for a folder whose preprocessor_config.json has
    it, and the others the answer with that flag."""
    import shutil

    run = ["--image-size", "896x896", "--images-per-example", "2", "--batch-size", "2", "--train-vision",
           "--memory", "2GB", "--reserve", "1.7GB"]
    d = _json(qwen, *run)
    assert d["fits"] is False
    changes = {c["flags"]: c for c in d["plans"]["singles"]}
    assert {"--images-per-example 1", "no --train-vision", "--grad-checkpoint",
            "--batch-size 1 --gradient-accumulation-steps 2", "--cache-size 2"} <= set(changes)
    caps = [f for f in changes if f.startswith("max_pixels")]
    assert caps and all(changes[f]["bytes"] < d["estimate"]["predicted_peak_bytes"] for f in changes)
    capped = tmp_path / "capped"
    shutil.copytree(qwen, capped)
    pre = json.loads((capped / "preprocessor_config.json").read_text())
    cap = int(caps[0].split()[1])
    (capped / "preprocessor_config.json").write_text(json.dumps({**pre, "max_pixels": cap}))
    assert changes[caps[0]]["bytes"] == _json(capped, *run)["estimate"]["predicted_peak_bytes"]
    same = {"--images-per-example 1": ["--images-per-example", "1"], "--grad-checkpoint": ["--grad-checkpoint"],
            "--cache-size 2": ["--cache-size", "2"]}
    for flags, extra in same.items():
        assert changes[flags]["bytes"] == _json(qwen, *run, *extra)["estimate"]["predicted_peak_bytes"], flags
    frozen = [a for a in run if a != "--train-vision"]
    assert changes["no --train-vision"]["bytes"] == _json(qwen, *frozen)["estimate"]["predicted_peak_bytes"]
    accumulated = _json(qwen, *run, "--batch-size", "1", "--grad-accumulation-steps", "2")
    assert changes["--batch-size 1 --gradient-accumulation-steps 2"]["bytes"] == accumulated["estimate"]["predicted_peak_bytes"]
    plan = d["plans"]["combination"]
    assert plan and plan[-1]["fits"] and [c["bytes"] for c in plan] == sorted((c["bytes"] for c in plan), reverse=True)
    assert "--lora-dropout 0" not in changes  # the run has no dropout


def test_plans_show_on_the_screen_when_the_run_does_not_fit(qwen):
    r = probe(qwen, "--image-size", "896x896", "--train-vision", "--memory", "2GB", "--reserve", "1.9GB")
    assert r.exit_code == 0, r.output
    assert "Changes" in r.output and "memory only" in r.output and "max_pixels" in r.output
    assert "no --train-vision" in r.output
    fits = probe(qwen, "--image-size", "224x224", "--memory", "16GB")
    assert "Changes" not in fits.output and "Changes" in probe(qwen, "--image-size", "224x224", "--memory", "16GB", "-v").output


@pytest.fixture(scope="module")
def deep_qwen(tmp_path_factory):
    """Eight language blocks: enough for slices that peak where the whole run does."""
    folder = tmp_path_factory.mktemp("vlm") / "qwen2_5_vl"
    tiny_vlms.write_model(folder, "qwen2_5_vl", layers=8, width=128)
    tiny_vlms.write_data(folder / "data", (448, 448))
    return folder


def test_a_run_over_this_machine_s_budget_is_measured_by_slice(deep_qwen, monkeypatch):
    """The estimate over the budget: slices of the language model, each peaking at the
    language model's moment as the whole does, extrapolated within 3% of the whole run."""
    import mlxfit.answer

    whole = json.loads(probe(deep_qwen, "--data", deep_qwen / "data", "--measure", "--json").output)["measured"]
    assert whole["method"] == "whole" and whole["slice"] is None
    monkeypatch.setattr(mlxfit.answer, "local_usable_bytes", lambda machine, reserve: 60_000_000)
    d = json.loads(probe(deep_qwen, "--data", deep_qwen / "data", "--measure", "--json").output)
    m = d["measured"]
    assert d["estimate"]["predicted_peak_bytes"] > 60_000_000 and m["method"] == "slice"
    # below three blocks a slice's peak is the vision tower's, not the language model's
    assert [s["blocks"] for s in m["slice"]["blocks"]] == [3, 5, 4] and m["slice"]["total_blocks"] == 8
    assert m["slice"]["peak_bytes"] < 60_000_000 < whole["peak_bytes"]
    assert m["peak_bytes"] == pytest.approx(whole["peak_bytes"], rel=0.03)


def test_a_slice_over_the_budget_or_a_shallow_model_is_refused_in_one_line(deep_qwen, qwen, monkeypatch):
    import mlxfit.answer

    monkeypatch.setattr(mlxfit.answer, "local_usable_bytes", lambda machine, reserve: 30_000_000)
    r = probe(deep_qwen, "--data", deep_qwen / "data", "--measure")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "even the largest slice of its language model needs about" in r.output.strip().splitlines()[-1]
    r = probe(qwen, "--data", deep_qwen / "data", "--measure", "--slice")  # two blocks: no slice holds fewer
    assert r.exit_code == 1 and "can only be measured whole" in r.output.strip().splitlines()[-1]


def test_lora_dropout_is_mlx_vlm_trains_flag_and_its_adapters_drop_their_input():
    """--lora-dropout [default 0.0] reaches mlx-vlm's LoRALinear, which drops its input
    before lora_a, as mlx-lm's does: the dropped input and its mask live until the backward."""
    import inspect

    from mlx_vlm.train import build_parser
    from mlx_vlm.trainer.peft.lora_layers import LoRALinear

    from mlxfit.measure.vision import flags_of
    from mlxfit.model.vision_run import training_of

    parser = build_parser()
    assert vars(parser.parse_args(["--model", "x"]))["lora_dropout"] == 0.0
    flags = flags_of(training_of({"dropout": 0.1}))
    assert vars(parser.parse_args(["--model", "x", *flags]))["lora_dropout"] == 0.1
    assert "self.dropout(x) @ self.lora_a" in inspect.getsource(LoRALinear.__call__)


def test_lora_dropout_is_counted_as_mlx_vlm_trains_measures_it(tmp_path, monkeypatch):
    # 8 text blocks, so the peak's moment holds nearly every block's dropped inputs (the
    # last block's own go early in its backward); on a 2-block model they are half of it.
    tiny_vlms.write_model(tmp_path / "deep", "qwen2_vl", width=128, layers=8)
    tiny_vlms.write_data(tmp_path / "data", (56, 56), images=1, rows=2, words=150)
    monkeypatch.chdir(tmp_path)
    measured, predicted = {}, {}
    for p in ("0", "0.1"):
        d = json.loads(probe("deep", "--data", "data", "--lora-dropout", p, "--measure", "--json").output)
        assert d["run"]["training"]["lora_dropout"] == float(p)
        measured[p], predicted[p] = d["measured"]["peak_bytes"], d["estimate"]["predicted_peak_bytes"]
    counted = predicted["0.1"] - predicted["0"]
    assert counted > 0.15 * predicted["0"]
    assert measured["0.1"] - measured["0"] == pytest.approx(counted, rel=0.15)
    # Where the run does not fit, dropping the dropout is a change sized as the run without it.
    d = json.loads(probe("deep", "--data", "data", "--lora-dropout", "0.1", "--memory", "0.03GB", "--json").output)
    change = next(c for c in d["plans"]["singles"] if c["flags"] == "--lora-dropout 0")
    assert change["bytes"] == predicted["0"]
