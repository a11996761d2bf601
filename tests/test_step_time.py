"""A step's and a run's time: the chip table, the arithmetic on a hand-counted model,
mlx-lm's run defaults, and probe's answer carrying the time (no timing is asserted)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate import run_time as rt
from mlxfit.estimate import step_time as st
from mlxfit.model.dataset import batch_widths
from mlxfit.model.resolve import resolve_model
from mlxfit.model.training import TrainingConfig

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": "float32"}


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return resolve_model(str(tmp_path))


def test_chip_table_loads_and_every_row_cites_apple():
    chips = st.chips()
    assert len(chips) >= 12
    for c in chips:
        assert c.sources and all(s.startswith("https://www.apple.com/newsroom/") for s in c.sources), c.name
        assert c.gpu_cores > 0 and c.peak_operations > 0 and c.bandwidth > 0 and c.memory_gb
    fit = st.fitted_efficiency()
    assert 0 < fit["fitted"] <= 1
    low, high = fit["range"]
    assert low <= 1 <= high
    assert fit["heldout_runs"] > 0 and fit["fit_runs"] > 0


def test_chip_names_and_memory():
    assert st.find_chip("apple m3 max").name == "M3 Max"
    assert st.chip_for_memory(192 * 10**9).name == "M2 Ultra"  # only the M2 Ultra was sold with 192 GB
    assert st.chip_for_memory(36 * 10**9) is None  # M3 Pro, M3 Max and M4 Max were
    with pytest.raises(Exception, match="unknown chip"):
        st.find_chip("M9")


def test_step_arithmetic_on_a_hand_counted_model(tiny):
    # Per block: q 64x64, k 64x32, v 64x32, o 64x64, gate/up 64x128, down 128x64 = 36,864 weights.
    # Batch 2 of width 9: mlx-lm drops the last token, 8 tokens a row, 16 in all.
    training = TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2, max_seq_length=9)
    step = st.step_time(tiny, training, st.Speed(1.0, None, "unit", (1, 1)), 9)
    assert step.phases["forward"] == 16 * (2 * 2 * 36864 + 2 * 100 * 64)
    # Attention: 4 H d T per token and block forward (H d = 64, T = 8), twice that backward, both blocks trained.
    assert step.phases["attention"] == 16 * (2 * 4 * 64 * 8 + 2 * 2 * 4 * 64 * 8)
    assert step.phases["recompute"] == 0
    checkpointed = st.step_time(tiny, TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2,
                                                     max_seq_length=9, grad_checkpoint=True),
                                st.Speed(1.0, None, "unit", (1, 1)), 9)
    assert checkpointed.phases["recompute"] == 16 * 2 * (2 * 36864 + 4 * 64 * 8)
    assert step.seconds == sum(step.phases.values()) == step.operations


def test_the_memory_floor_bounds_a_small_step(tiny):
    from mlxfit.estimate.detailed import counted_totals

    training = TrainingConfig(num_layers=-1, batch_size=1, max_seq_length=9)
    weights = counted_totals(tiny, training)[0]
    slow_memory = st.Speed(1e15, weights / 2.0, "x", (1, 1))  # reading the weights takes 2 s
    step = st.step_time(tiny, training, slow_memory, 9)
    assert step.floor == pytest.approx(2.0) and step.seconds == pytest.approx(2.0)


def test_run_time_adds_iterations_validation_and_compile(tiny):
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=9)
    unit = st.Speed(1.0, None, "unit", (0.5, 2.0))
    run = rt.run_time(tiny, training, unit, iters=400, length=9, val_batches=3, steps_per_eval=200, save_every=10**6)
    step = st.step_time(tiny, training, unit, 9).seconds
    assert rt.evaluations(400, 200) == 3 and rt.evaluations(1000, 200) == 6 and rt.evaluations(450, 200) == 4
    assert run.train_seconds == 400 * step
    assert run.validation_seconds == 3 * 3 * st.evaluation_seconds(tiny, training, unit, 9)
    assert run.compile_seconds == rt.COMPILE_STEPS * step
    assert run.range == (run.seconds * 0.5, run.seconds * 2.0)
    # With --data, the mean over the batches' widths: narrower batches, a shorter run.
    narrow = rt.run_time(tiny, training, unit, iters=400, length=9, widths=(9, 5, 5, 5), val_batches=0)
    assert narrow.mean_step_seconds < step and narrow.from_data


def test_batch_widths_follow_iterate_batches():
    # Sorted by length, cut in 2, the remainder dropped, each padded to 1 + 32 k, capped.
    assert batch_widths([10, 70, 3, 40, 100], 2, 2048) == (33, 97)
    assert batch_widths([10, 70, 3, 40, 100], 2, 64) == (33, 64)


def test_mlx_lm_run_defaults_are_pinned():
    import mlx_lm

    source = Path(mlx_lm.__file__).parent / "lora.py"
    tree = ast.parse(source.read_text())
    defaults = next(ast.literal_eval(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "CONFIG_DEFAULTS" for t in node.targets))
    assert defaults["iters"] == rt.ITERS == 1000
    assert defaults["val_batches"] == rt.VAL_BATCHES
    assert defaults["steps_per_eval"] == rt.STEPS_PER_EVAL
    assert defaults["save_every"] == rt.SAVE_EVERY


def _probe(*args):
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_probe_json_carries_the_time_for_a_named_chip():
    out = _probe("--memory", "36GB", "--chip", "M3 Max", "--iters", "500")
    time = out["time"]
    assert time["basis"] == "M3 Max, fitted efficiency" and time["iters"] == 500
    assert time["range"][0] <= time["run_seconds"] <= time["range"][1]
    assert time["with_grad_checkpoint_seconds"] > time["run_seconds"]


def test_probe_infers_the_chip_from_a_memory_only_one_chip_had():
    assert _probe("--memory", "192GB")["time"]["basis"] == "M2 Ultra, fitted efficiency"
    assert "time" not in _probe("--memory", "36GB")  # three chips: which is not known


def test_probe_refuses_an_unknown_chip():
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--chip", "M9"])
    assert result.exit_code != 0 and "unknown chip 'M9'" in result.output and "Traceback" not in result.output


def test_bench_refuses_a_sweep_past_timeout_before_measuring():
    root = Path(__file__).resolve().parent.parent
    result = CliRunner().invoke(cli, ["bench", "-m", str(root / "examples" / "tiny-llama"), "--num-layers", "4",
                                      "--batch-size", "1,64", "--max-seq-length", "2048", "--timeout", "1"])
    assert result.exit_code == 1, result.output
    assert "refusing the sweep" in result.output and "past --timeout 1 s" in result.output
    assert "--slice" not in result.output and "Traceback" not in result.output
