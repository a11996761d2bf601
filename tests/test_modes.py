"""The training modes as files (mlxfit/modes/): each found by its name, and mode names
written nowhere else but the CLI's choice lists."""

import ast
from pathlib import Path

import pytest

from mlxfit.errors import BadInput
from mlxfit.modes import DEFAULT, for_model, get_mode, listed, names
from mlxfit.modes.base import MLX_LM, MLX_LM_LORA, MLX_VLM, Mode

PACKAGE = Path(__file__).resolve().parent.parent / "mlxfit"


def test_every_module_in_modes_is_a_mode_found_by_its_name():
    files = sorted(p.stem for p in (PACKAGE / "modes").glob("*.py") if p.stem not in ("__init__", "base"))
    assert sorted(names()) == files
    for name in names():
        mode = get_mode(name)
        assert isinstance(mode, Mode) and mode.name == name
    assert names()[0] == DEFAULT and get_mode(DEFAULT).trainer == MLX_LM


def test_mlx_lm_lora_modes_hold_their_trainers_facts():
    # mlx_lm_lora/train.py load_reference_model: DPO and GRPO load a reference.
    assert {n for n in names() if get_mode(n).reference} == {"dpo", "grpo"}
    assert all(get_mode(n).trainer == MLX_LM_LORA for n in listed() if n != DEFAULT)
    assert [n for n in listed() if not get_mode(n).compiled] == ["cpo"]


def test_a_vision_language_model_chooses_mlx_vlms_mode_and_train_mode_does_not_list_it():
    vision = {"model_type": "qwen2_vl", "vision_config": {}}
    chosen = for_model(vision, None)
    assert get_mode(chosen).trainer == MLX_VLM and get_mode(chosen).command == "mlx_vlm.train"
    assert chosen not in listed() and chosen in names()
    assert for_model({"model_type": "llama"}, None) is None
    with pytest.raises(BadInput, match="not covered"):
        for_model(vision, "dpo")


def test_a_mode_not_covered_is_refused_in_one_line():
    with pytest.raises(BadInput, match="train mode 'kto' is not covered"):
        get_mode("kto")


def test_mlx_lm_lora_modes_refuse_what_their_trainer_cannot_do():
    for name in names():
        refusal = get_mode(name).refusal(hostfile="nodes.json")
        assert (refusal is None) == get_mode(name).by_mlx_lm


def _choice_lists(tree) -> set:
    """The ids of string constants inside click.Choice(...) calls."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Choice":
            inside |= {id(n) for n in ast.walk(node)}
    return inside


def test_mode_names_are_written_only_in_the_mode_modules():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "modes":
            continue
        tree = ast.parse(path.read_text())
        allowed = _choice_lists(tree) if path.parent.name == "cli" else set()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and node.value in names() and id(node) not in allowed):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value!r}")
    assert not found, "mode names outside mlxfit/modes/ (ask the mode instead):\n" + "\n".join(found)


def test_lora_sft_is_said_as_mlx_lm_lora_runs_it_and_judged_on_mlx_lm_s_range():
    from click.testing import CliRunner

    from mlxfit.cli.main import cli

    out = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--train-mode", "lora_sft", "--memory", "16GiB",
                                   "--backend", "cpu"], catch_exceptions=False).output
    assert "mlx_lm_lora.train --train-mode sft" in out and "rows of 2048 tokens" in out
    assert "mlx-lm's SFT range on the cpu backend" in out and "LORA_SFT" not in out
