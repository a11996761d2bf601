"""The VLMs whose config.json mlxfit ships (data/vlm_configs.json): each builds lazily as
mlx-vlm's own class with its published size, and probe answers for it offline, with an
empty Hugging Face cache, from the shipped copy (a local folder still comes first)."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

pytest.importorskip("mlx_vlm")

import tiny_vlms  # noqa: E402
from mlxfit.cli.main import cli  # noqa: E402
from mlxfit.estimate.verdict import Verdict  # noqa: E402
from mlxfit.model.images import shipped_image_facts  # noqa: E402
from mlxfit.model.vision import vision_model  # noqa: E402
from mlxfit.model.vlm_catalog import shipped_vlm, shipped_vlms  # noqa: E402

# (language model, vision tower, projector) parameters of mlx-vlm 0.7.10's model built
# from each shipped config. The published sizes: Qwen2.5-VL-3B 3.75B, Qwen2.5-VL-7B 8.29B,
# Qwen3-VL-2B 2.13B, Qwen3-VL-4B 4.44B, gemma-3-4b-it 4.30B (mlx-vlm's gemma3 builds its
# lm_head beside the tied embedding, 262208 x 2560 = 0.67B more, and fills it from the
# embedding when loading: language_model.lm_head, gemma3/language.py).
PARAMS = {
    "Qwen/Qwen2.5-VL-3B-Instruct": (3_085_938_688, 668_684_288, 0),
    "Qwen/Qwen2.5-VL-7B-Instruct": (7_615_616_512, 676_550_144, 0),
    "Qwen/Qwen3-VL-2B-Instruct": (1_720_574_976, 406_957_056, 0),
    "Qwen/Qwen3-VL-4B-Instruct": (4_022_468_096, 415_347_712, 0),
    "google/gemma-3-4b-it": (4_551_515_648, 416_866_032, 2_950_272),
}
PUBLISHED = {
    "Qwen/Qwen2.5-VL-3B-Instruct": 3.75e9,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8.29e9,
    "Qwen/Qwen3-VL-2B-Instruct": 2.13e9,
    "Qwen/Qwen3-VL-4B-Instruct": 4.44e9,
    "google/gemma-3-4b-it": 4.30e9 + 262_208 * 2560,
}


def test_every_shipped_config_is_pinned_and_has_its_image_facts():
    assert set(PARAMS) == {m["id"] for m in shipped_vlms().values()}
    for key, entry in shipped_vlms().items():
        assert entry["source"] == f"https://huggingface.co/{entry['id']}/blob/main/config.json"
        assert entry["found_in"]
        config = entry["config"]
        assert isinstance(config.get("vision_config"), dict)
        assert config.get("torch_dtype") or config.get("text_config", {}).get("dtype") == "bfloat16"
        # the image facts shipped beside it agree with the full config
        facts = shipped_image_facts()[key]["config"]
        assert facts["model_type"] == config["model_type"]
        for k, v in facts["vision_config"].items():
            assert config["vision_config"].get(k, v) == v, (entry["id"], k)


@pytest.mark.parametrize("model_id", sorted(PARAMS))
def test_each_builds_lazily_as_mlx_vlm_does_at_its_published_size(model_id):
    info = vision_model(shipped_vlm(model_id)["config"], model_id)
    assert (info.language_params, info.vision_params, info.projector_params) == PARAMS[model_id]
    assert info.params == pytest.approx(PUBLISHED[model_id], rel=0.01)
    assert info.dtype_bytes == 2  # bfloat16 as published
    assert info.language is not None  # mlx-lm sizes its language model too


def test_ids_are_found_in_any_case():
    assert shipped_vlm("qwen/qwen2.5-vl-3b-instruct")["id"] == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert shipped_vlm("Qwen/Qwen2.5-VL-72B-Instruct") is None and shipped_vlm(None) is None


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache, offline; any look-up of the Hub fails the test."""
    assert not any((tmp_path / "hf").glob("**/config.json"))

    def refuse(*_, **__):
        raise AssertionError("the Hub was asked for a shipped VLM's config.json")

    monkeypatch.setattr("mlxfit.model.resolve.from_hub", refuse)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", refuse)


@pytest.mark.parametrize("model_id", ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen3-VL-2B-Instruct", "google/gemma-3-4b-it"])
def test_probe_answers_offline_from_the_shipped_config(no_hub, model_id):
    r = CliRunner().invoke(cli, ["probe", model_id, "--memory", "64GB"])
    assert r.exit_code == 0, r.output
    assert "mlx_vlm.train lora" in r.output
    assert "shipped copy" in r.output
    assert re.search(r"Verdict\s+(fits|tight|does not fit)", r.output)
    j = CliRunner().invoke(cli, ["probe", model_id, "--memory", "64GB", "--json"])
    assert j.exit_code == 0, j.output
    d = json.loads(j.output)
    assert d["model"]["id"] == model_id and d["model"]["source"] == "catalog"
    assert d["model"]["params"] == sum(PARAMS[model_id])
    assert d["verdict"] in {v.value for v in (Verdict.FITS, Verdict.TIGHT, Verdict.DOES_NOT_FIT)}
    assert any("shipped copy" in n for n in d["notes"])


def test_a_local_folder_of_the_same_name_comes_first(no_hub, tmp_path, monkeypatch):
    folder = tmp_path / "Qwen" / "Qwen2.5-VL-3B-Instruct"
    tiny_vlms.write_model(folder, "qwen2_5_vl")
    monkeypatch.chdir(tmp_path)
    d = json.loads(CliRunner().invoke(cli, ["probe", "Qwen/Qwen2.5-VL-3B-Instruct", "--json"]).output)
    assert d["model"]["source"] == "local" and d["model"]["params"] < 10**8
    assert not any("shipped copy" in n for n in d["notes"])
