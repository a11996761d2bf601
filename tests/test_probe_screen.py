"""probe's first answer fits one screen and leads with the verdicts; -v keeps the whole
answer; a narrow terminal reflows the text instead of cutting numbers."""

import re

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli

SCREEN_LINES = 24
ROOM_FOR_ONE_MORE_LINE = 1  # a line the answer may still gain (how long the run will take)


def invoke(*args, columns=80):
    """The command's output on a terminal `columns` wide (the shared console reads COLUMNS
    once, when it is made, so its width is set here for the call)."""
    from mlxfit.render.text import console

    before = console._width
    console._width = columns
    try:
        result = CliRunner().invoke(cli, list(args), env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    finally:
        console._width = before
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("args", [
    ("Qwen/Qwen3-4B", "--memory", "16GiB"),
    ("Qwen/Qwen3-0.6B", "--memory", "16GiB"),
    ("Qwen/Qwen2.5-7B-Instruct", "--memory", "16GB"),
    ("Qwen/Qwen3-14B", "--memory", "112GiB"),
    ("Qwen/Qwen2.5-3B-Instruct", "--method", "full", "--memory", "64GiB"),
    ("mlx-community/Qwen3-4B-4bit", "--method", "full", "--memory", "16GiB"),
    ("meta-llama/Llama-3.2-1B-Instruct", "--memory", "8GiB", "--batch-size", "1", "--max-seq-length", "1024"),
    ("7B", "--memory", "16GiB"),
], ids=lambda a: " ".join(a))
def test_the_first_answer_fits_one_screen_and_leads_with_each_verdict(args):
    out = invoke("probe", *args)
    lines = out.splitlines()
    assert len(lines) <= SCREEN_LINES - ROOM_FOR_ONE_MORE_LINE, out
    assert all(len(line) <= 80 for line in lines), out
    head = " ".join(" ".join(lines[:6]).split())
    for method in ("QLoRA", "full"):
        row = re.search(rf"\b{method}\b[ ¹◀]*(.*?)(?= (?:LoRA|QLoRA|full)\b[ ¹◀]* |$)", head)
        assert row and re.search(r"(fits|tight|does not fit|mlx-lm cannot)", row.group(1)), (method, head)


def test_the_first_lines_name_the_longest_examples_that_fit_per_method():
    import json

    data = json.loads(invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GiB", "--json"))
    head = " ".join(" ".join(invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GiB").splitlines()[:4]).split())
    assert head.startswith("At batch 4, the longest examples that fit the 12.9 GB budget:")
    labels = {"lora": "LoRA ◀", "qlora": "QLoRA", "full": "full"}
    for fit in data["longest_examples"]:
        words = "none" if fit["tokens"] is None else f"up to {fit['tokens']:,} tokens"
        estimate = next(e for e in data["estimates"] if e["method"] == fit["method"])
        assert f"{labels[fit['method']]} {words} · at 2,048:" in head
        assert estimate["verdict"] in head.split(labels[fit["method"]])[1]


def test_verbose_keeps_the_whole_answer():
    first = invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GiB")
    whole = invoke("probe", "Qwen/Qwen3-4B", "--memory", "16GiB", "-v")
    for shown in ("weights (frozen)", "your run peaks during", "Alternatives:", "Each change alone:", "budget   headroom",
                  "The estimate is "):
        assert shown in whole and shown not in first, shown
    assert "│" in whole and "│" not in first  # the bars
    assert "The plan that fits LoRA at the least cost (-v: 3 alternatives):" in first


NUMBER_CUT = re.compile(r"\d…|…\d|[(-]…")


@pytest.mark.parametrize("args", [
    ("probe", "Qwen/Qwen3-4B", "--memory", "16GiB"),
    ("probe", "Qwen/Qwen3-4B", "--memory", "16GiB", "-v"),
    ("probe", "7B", "--memory", "16GiB", "-v"),
    ("probe", "Qwen/Qwen2.5-3B-Instruct", "--method", "full", "--memory", "64GiB", "-v"),
    ("fits", "--memory", "16GiB"),
    ("models",),
], ids=lambda a: " ".join(a))
def test_a_narrow_terminal_reflows_and_cuts_no_number(args):
    out = invoke(*args, columns=50)
    assert "…" not in out and not NUMBER_CUT.search(out), out
    assert all(len(line) <= 50 for line in out.splitlines()), [line for line in out.splitlines() if len(line) > 50]


def test_the_estimate_far_below_the_rule_says_why():
    args = ("probe", "Qwen/Qwen2.5-3B-Instruct", "--method", "full", "--batch-size", "1", "--max-seq-length", "512",
            "--memory", "64GiB")
    first = " ".join(invoke(*args).split())
    assert "The estimate is 0.34× the rule of thumb: only the last 16 of 36 blocks train." in first
    whole = " ".join(invoke(*args, "-v").split())
    assert "The estimate is 0.34× the rule: the rule counts 12 GB per billion parameters for all 3.09B (37.0 GB)" in whole
    assert "only the last 16 of 36 blocks train; adam keeps its 4.9 GB of state in the weights' bfloat16" in whole


def test_no_plan_keeps_full_fine_tuning_on_a_quantized_base():
    import json

    data = json.loads(invoke("probe", "mlx-community/Qwen3-4B-4bit", "--method", "full", "--memory", "16GiB", "--json"))
    assert data["plan"], "a plan is offered"
    for option in [*data["plan"], *data["remedies"]]:
        flags = option.get("flags") or option["change"]
        assert "--fine-tune-type lora" in flags or "--model" in flags, flags
    first = " ".join(invoke("probe", "mlx-community/Qwen3-4B-4bit", "--method", "full", "--memory", "16GiB").split())
    assert "Full fine-tuning itself needs the 16-bit base" in first


def test_fits_stands_each_size_on_a_stated_family():
    import json

    rows = json.loads(invoke("fits", "--memory", "16GiB", "--json"))["rows"]
    stand = {r["params"] / 1e9: r["reference"]["model"] for r in rows}
    assert stand[14] == "Qwen/Qwen2.5-14B-Instruct" and stand[7] == "Qwen/Qwen2.5-7B-Instruct"
    assert stand[70] == "meta-llama/Llama-3.3-70B-Instruct"
    assert "each size stands for the catalog's Qwen2.5 or Llama 3 nearest in size" in " ".join(
        invoke("fits", "--memory", "16GiB").split())


def test_preference_answer_is_short_and_verbose_has_the_phases():
    first = invoke("probe", "Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--memory", "16GiB")
    whole = invoke("probe", "Qwen/Qwen3-0.6B", "--train-mode", "dpo", "--memory", "16GiB", "-v")
    assert first.startswith("Verdict  does not fit") and len(first.splitlines()) <= SCREEN_LINES
    assert "What each change would need" in whole and "What each change would need" not in first
    assert "of which" in whole and "of which" not in first
