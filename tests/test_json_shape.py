"""One JSON shape for every mode (mlxfit/schema.py, docs/json.md): the same top-level
keys, and the run's estimate with its peak, range, verdict and phases in one place."""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.schema import KEYS, SCHEMA
from conftest import LINUX_CPU

DOC = Path(__file__).parent.parent / "docs" / "json.md"
ESTIMATE_KEYS = {"train_mode", "method", "backend", "predicted_peak_bytes", "predicted_range_bytes", "verdict", "fits",
                 "peak_phase", "phases"}


def probe_json(*args) -> dict:
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--memory", "16GiB", *args, "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture
def answers(platform):
    platform(LINUX_CPU)
    return {mode: probe_json("--train-mode", mode) for mode in ("sft", "dpo", "grpo")}


def test_every_mode_answers_with_the_same_top_level_keys(answers):
    assert {mode: list(a) for mode, a in answers.items() if set(a) != set(answers["sft"])} == {}
    assert set(KEYS) <= set(answers["sft"])
    assert all(a["schema"] == SCHEMA and a["train_mode"] == mode for mode, a in answers.items())


def test_the_runs_estimate_has_its_peak_range_verdict_and_phases_in_one_place(answers):
    for mode, a in answers.items():
        e = a["estimate"]
        assert ESTIMATE_KEYS <= set(e), mode
        assert e["predicted_peak_bytes"] == max(p["bytes"] for p in e["phases"])
        assert e["peak_phase"] in [p["name"] for p in e["phases"]]
        low, high = e["predicted_range_bytes"]
        assert low <= e["predicted_peak_bytes"] <= high
        assert (a["verdict"], a["fits"]) == (e["verdict"], e["fits"])
    assert len(answers["sft"]["estimate"]["phases"]) == 1 and len(answers["grpo"]["estimate"]["phases"]) == 2


def test_sfts_estimate_is_the_selected_methods(answers):
    sft = answers["sft"]
    selected = next(e for e in sft["estimates"] if e["selected"])
    assert sft["estimate"]["method"] == selected["method"]
    assert sft["estimate"]["predicted_peak_bytes"] == selected["predicted_peak_bytes"]
    assert sft["estimate"]["phases"][0]["breakdown"] == selected["breakdown"]
    assert sft["estimate"]["verdict"] == selected["verdict"]


def test_the_page_describes_every_top_level_key():
    documented = set(re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)?(?:, `([a-z_]+)`)?", DOC.read_text(), flags=re.M))
    names = {n for pair in documented for n in pair if n}
    assert set(KEYS) <= names
