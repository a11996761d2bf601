"""A step's and a run's time: the chip table, the arithmetic on a hand-counted model,
mlx-lm's run defaults, and probe's answer carrying the time (no timing is asserted)."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
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
        assert c.gpu_cores > 0 and c.gemm_operations > 0 and c.bandwidth > 0 and c.memory_gb
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
    assert step.floor == pytest.approx(2.0) and step.seconds >= 2.0
    assert step.seconds == max(sum(step.phases.values()), step.floor)
    fast_memory = st.Speed(1e15, weights * 1e6, "x", (1, 1))  # the weights in a microsecond: the phases bind
    assert st.step_time(tiny, training, fast_memory, 9).seconds == sum(st.step_time(tiny, training, fast_memory,
                                                                                    9).phases.values())


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
    # mx.compile traces the step again for each new input shape: each distinct width compiles once.
    assert narrow.compile_seconds == pytest.approx(rt.COMPILE_STEPS * (step + st.step_time(tiny, training, unit, 5).seconds))


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
    assert _probe("--memory", "36GB")["time"] is None  # three chips: which is not known


def test_probe_refuses_an_unknown_chip():
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--chip", "M9"])
    assert result.exit_code != 0 and "unknown chip 'M9'" in result.output and "Traceback" not in result.output


def test_bench_refuses_a_sweep_past_timeout_before_measuring():
    root = Path(__file__).resolve().parent.parent
    result = CliRunner().invoke(cli, ["bench", "-m", str(root / "examples" / "tiny-llama"), "--num-layers", "4",
                                      "--batch-size", "8,64", "--max-seq-length", "2048", "--timeout", "1"])
    assert result.exit_code == 1, result.output
    assert "refusing the sweep" in result.output and "past --timeout 1 s" in result.output
    assert "--slice" not in result.output and "Traceback" not in result.output


def test_the_work_besides_matrix_products_on_a_hand_counted_model(tiny):
    from mlxfit.estimate import step_work as sw
    from mlxfit.estimate.detailed import counted_totals
    from mlxfit.measure.rate import MachineRates

    # Per block and token, forward: 20 passes over hidden 64, 10 over the q and k heads'
    # (4 + 2) x 16, 8 over the MLP's 128, 6 over 4 heads x T = 8 scores: 3,456 elements.
    # Both blocks trained in full: their backward twice the forward's passes. 16 tokens, float32.
    training = TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2, max_seq_length=9)
    _, elements, trainable_bytes, _ = counted_totals(tiny, training)
    per_block = 20 * 64 + 10 * 6 * 16 + 8 * 128 + 6 * 4 * 8
    assert per_block == 3456
    work = sw.step_work(tiny, training, 9)
    assert work.traffic_bytes == 16 * 4 * (2 * per_block + 2 * 2 * per_block) + 16 * 4 * 8 * 100 + 7 * trainable_bytes
    # An exp per score and a sigmoid per MLP element of each block; 2 exps per logit.
    assert work.transcendentals == 16 * 2 * (4 * 8 + 128) + 2 * 16 * 100
    # Adam's square root per weight, timed apart: MLX's CPU runs it far faster than an exp.
    assert work.roots == elements
    # The loss; each block's forward; each trained block's backward; Adam on 9 arrays a block (7 linears, 2 norms).
    assert work.ops == 30 + 2 * 81 + 2 * 92 + 18 * 12
    # Of those exps, the attention's softmax: 4 heads x T = 8 scores per token of each block.
    assert work.scores == 16 * 2 * 4 * 8
    checkpointed = sw.step_work(tiny, TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2,
                                                     max_seq_length=9, grad_checkpoint=True), 9)
    assert checkpointed.traffic_bytes - work.traffic_bytes == 16 * 4 * 2 * per_block
    assert checkpointed.ops - work.ops == 2 * 81
    assert checkpointed.scores - work.scores == 16 * 2 * 4 * 8  # the recomputed blocks' softmax again
    assert sw.forward_work(tiny, 8, 2).scores == 16 * 2 * 4 * 8
    # LoRA on the last block: its 7 adapters scale and add their outputs (15 float32 passes over 512 widths).
    lora = TrainingConfig(num_layers=1, batch_size=2, max_seq_length=9)
    adapters = sw.step_work(tiny, lora, 9)
    _, _, lora_bytes, _ = counted_totals(tiny, lora)
    assert adapters.traffic_bytes == (16 * 4 * (2 * per_block + 2 * per_block) + 16 * 4 * 15 * 512
                                      + 16 * 4 * 8 * 100 + 7 * lora_bytes)
    assert adapters.ops == 30 + 2 * 81 + 92 + 7 * 10 + 14 * 12
    # The step times it at the rates given: elementwise bytes, exps and operations apart.
    rates = MachineRates(matmul=1e9, elementwise=1e8, transcendental=1e6, operation=1e-5)
    step = st.step_time(tiny, training, st.measured_speed(rates), 9)
    assert step.phases["elementwise"] == pytest.approx(work.traffic_bytes / 1e8 + work.transcendentals / 1e6)
    assert step.phases["dispatch"] == pytest.approx(work.ops * 1e-5)
    # With a softmax rate measured, the scores go at it and the other exps at the exp rate.
    softmax = MachineRates(matmul=1e9, elementwise=1e8, transcendental=1e6, operation=1e-5, softmax=5e5)
    assert st.step_time(tiny, training, st.measured_speed(softmax), 9).phases["elementwise"] == pytest.approx(
        work.traffic_bytes / 1e8 + (work.transcendentals - work.scores) / 1e6 + work.scores / 5e5)
    # With a square-root rate measured, Adam's roots go at it.
    roots = MachineRates(matmul=1e9, elementwise=1e8, transcendental=1e6, operation=1e-5, root=2e7)
    assert st.step_time(tiny, training, st.measured_speed(roots), 9).phases["elementwise"] == pytest.approx(
        work.traffic_bytes / 1e8 + work.transcendentals / 1e6 + elements / 2e7)
    # With a loss rate measured, the logits go at it, their counted passes and exps left out.
    loss = MachineRates(matmul=1e9, elementwise=1e8, transcendental=1e6, operation=1e-5, loss=4e5)
    logits = 16 * 100
    assert work.loss_logits == logits
    assert st.step_time(tiny, training, st.measured_speed(loss), 9).phases["elementwise"] == pytest.approx(
        (work.traffic_bytes - 8 * 4 * logits) / 1e8 + (work.transcendentals - 2 * logits) / 1e6 + logits / 4e5)
    # A Mac's GPU: the exps are in the traffic, not timed apart.
    mac = st.Speed(1e12, 1e11, "x", (1, 1), seconds_per_op=1e-6)
    assert st.step_time(tiny, training, mac, 9).phases["elementwise"] == pytest.approx(work.traffic_bytes / 1e11)


def test_machine_rates_are_measured_once_and_read_from_the_cache(monkeypatch, tmp_path):
    import mlxfit.measure.rate as rate

    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measured(dtype, bits=None, group_size=64):
        calls.append(dtype)
        return rate.MachineRates(1e9 * len(calls), 1e8, 1e6, 1e-5)

    monkeypatch.setattr(rate, "measure_rates", measured)
    first = rate.machine_rates("float32")
    assert rate.machine_rates("float32") == first and calls == ["float32"]
    assert (tmp_path / "cache" / "machine_rates.json").exists()
    assert rate.machine_rates("bfloat16").matmul == 2e9 and calls == ["float32", "bfloat16"]  # another dtype
    assert rate.machine_key("float32") != rate.machine_key("bfloat16")


def test_probe_on_this_machine_gives_the_time_at_its_rates(monkeypatch):
    import mlxfit.measure.rate as rate

    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: rate.MachineRates(1e10, 1e10, 3e7, 1e-5))
    root = Path(__file__).resolve().parent.parent
    result = CliRunner().invoke(cli, ["probe", str(root / "examples" / "tiny-llama"), "--num-layers", "-1",
                                      "--max-seq-length", "256", "--json"])
    assert result.exit_code == 0, result.output
    time = json.loads(result.output)["time"]
    assert time["basis"] == "rates measured on this machine"
    assert time["widest_step"]["phases"]["elementwise"] > 0 and time["widest_step"]["phases"]["dispatch"] > 0


def test_probe_of_a_model_shallower_than_the_default_layers_says_what_to_give():
    # mlx-lm trains 16 layers by default; the 4-block example refuses it (as mlx-lm does), in one line
    # that names the flag that gets an answer (and its Time line).
    root = Path(__file__).resolve().parent.parent
    result = CliRunner().invoke(cli, ["probe", str(root / "examples" / "tiny-llama")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "give --num-layers 4 or fewer, or -1 for all" in " ".join(result.output.split())


def test_the_plan_and_each_change_carry_their_run_time():
    # A 7B at mlx-lm's defaults does not fit 24 GB: every option and sized single change is timed
    # as a whole run on the M4 Pro, a smaller batch for the iterations that see the same examples.
    out = _probe("--memory", "24GB", "--chip", "M4 Pro", "--model", "Qwen/Qwen2.5-7B-Instruct", "--iters", "500")
    now = out["time"]["run_seconds"]
    assert out["plan"] and all(o["run_seconds"] > 0 for o in out["plan"])
    remedies = {r["change"]: r for r in out["remedies"]}
    checkpointed = remedies["--grad-checkpoint"]
    assert checkpointed["iters"] == 500
    assert checkpointed["run_seconds"] == pytest.approx(out["time"]["with_grad_checkpoint_seconds"], rel=1e-3)
    assert checkpointed["run_seconds"] > now
    smaller = remedies["--batch-size 1 --grad-accumulation-steps 4"]
    assert smaller["iters"] == 2000  # batch 4 for 500 iterations: batch 1 for 2,000
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen2.5-7B-Instruct", "--memory", "24GB", "--chip", "M4 Pro",
                                      "--iters", "500", "-v"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    from mlxfit.render.time import clock

    assert f"forward (slower); {clock(checkpointed['run_seconds'])} ({clock(now)} now)" in text
    assert f"{clock(smaller['run_seconds'])} for 2,000 iterations, the same examples ({clock(now)} now)" in text


def test_preference_steps_are_timed_from_their_counted_work(tiny):
    """DPO: the policy over chosen and rejected rows plus the reference's forwards; CPO/ORPO the
    policy alone; GRPO: group_size completions generated token by token, then its scoring."""
    from mlxfit.model.preference import PreferenceRun

    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=9)
    speed = st.Speed(1e9, 1e8, "x", (1, 1), seconds_per_op=1e-6)
    dpo = st.preference_step_time(PreferenceRun("dpo", training), tiny, speed, 9)
    orpo = st.preference_step_time(PreferenceRun("orpo", training), tiny, speed, 9)
    policy = st.step_time(tiny, replace(training, batch_size=4), speed, 9)  # chosen and rejected: 2 x batch rows
    assert orpo.operations == policy.operations and orpo.seconds == pytest.approx(policy.seconds)
    assert dpo.operations == policy.operations + st.forward_operations(tiny, 8, 4)
    assert dpo.phases["reference"] == pytest.approx(st.forward_operations(tiny, 8, 4) / 1e9) and dpo.seconds > orpo.seconds
    grpo = PreferenceRun("grpo", training, group_size=2, max_completion_length=5)
    step = st.preference_step_time(grpo, tiny, speed, prompt_length=4)
    assert step.phases["generation"] > 0 and step.phases["reference"] > 0
    longer = st.preference_step_time(replace(grpo, max_completion_length=50), tiny, speed, prompt_length=4)
    assert longer.phases["generation"] > 9 * step.phases["generation"] / 2  # one forward of every row a token


def test_grpo_generates_its_group_in_rounds_of_batch_size_rows(tiny):
    """mlx-lm-lora's generate_grpo lets mlx-lm's BatchGenerator decode batch_size rows at
    once: batch 2 x group 4 completions of 5 tokens are 4 rounds of 5 steps of 2 rows, and
    one step more a round (mlx-lm's GenerationBatch steps once as it starts)."""
    import inspect

    from mlx_lm_lora.trainer import grpo_trainer

    source = inspect.getsource(grpo_trainer.generate_grpo)
    assert "completion_batch_size=batch_size" in source and "BatchGenerator(" in source
    assert "batch_size=args.batch_size" in inspect.getsource(grpo_trainer.train_grpo)
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=4)
    from mlx_lm.generate import GenerationBatch

    assert "self._step()" in inspect.getsource(GenerationBatch.__init__)
    assert st.rollout_rounds(training, group_size=4, completion_length=5) == (24, 2)
    assert st.rollout_rounds(replace(training, hosts=2), group_size=4, completion_length=5) == (24, 1)
    speed = st.Speed(1e9, 1e8, "x", (1, 1), seconds_per_op=1e-6)
    step = st.grpo_step_time(tiny, training, speed, prompt_length=4, group_size=4, completion_length=5)
    # The policy's step and the reference's forward over 8 rows of 4 + 5 tokens; 24 decoding
    # steps of 2 rows; the 2 prompts' prefill.
    policy = st.phase_operations(tiny, replace(training, max_seq_length=9), 9, sequences=8)
    assert step.operations == (sum(policy.values()) + st.forward_operations(tiny, 9, 8)
                               + 24 * st.forward_operations(tiny, 1, 2) + st.forward_operations(tiny, 4, 2))


def test_the_loss_rate_times_mlx_lm_loss_and_its_equals(tiny):
    """The loss rate is measured on mlx-lm's default_loss; DPO's is the same cross-entropy
    over logits cast to float32 (so the same work in a float32 model, its own in half
    precision), GRPO's compiled log-probabilities its own: counted."""
    import inspect

    from mlx_lm_lora.trainer import dpo_trainer, grpo_trainer
    from mlx_lm.tuner.trainer import default_loss

    from mlxfit.measure import rate

    assert "training_loss(" in inspect.getsource(rate.loss_rate)
    import mlx.core as mx

    logits = mx.random.normal((2, 6, 11))
    batch = mx.random.randint(0, 11, (2, 7))
    lengths = mx.array([[0, 6], [2, 4]])
    real = mx.value_and_grad(lambda x: default_loss(lambda _: x, batch, lengths)[0])(logits)
    copy = mx.value_and_grad(lambda x: rate.training_loss(x, batch[:, 1:], lengths))(logits)
    assert mx.allclose(real[0], copy[0]).item() and mx.allclose(real[1], copy[1]).item()
    assert ".astype(mx.float32)" in inspect.getsource(dpo_trainer.get_token_scores)
    assert "cross_entropy" not in inspect.getsource(grpo_trainer._select_token_logps)
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=9)
    counted = st.Speed(1e9, 1e8, "x", (1, 1), transcendentals_per_second=1e6, seconds_per_op=1e-6)
    timed = replace(counted, loss_per_second=1.0)
    assert st.step_time(tiny, training, timed).seconds > st.step_time(tiny, training, counted).seconds + 1
    assert st.dpo_step_time(tiny, training, timed).seconds > st.dpo_step_time(tiny, training, counted).seconds + 1
    half = replace(tiny, config={**tiny.config, "torch_dtype": "bfloat16"})
    assert st.dpo_step_time(half, training, timed).seconds == pytest.approx(
        st.dpo_step_time(half, training, counted).seconds)
    assert st.grpo_step_time(tiny, training, timed, 4, 4, 5).seconds == pytest.approx(
        st.grpo_step_time(tiny, training, counted, 4, 4, 5).seconds)


def test_mlx_lm_lora_default_iterations_are_pinned():
    import mlx_lm_lora

    source = Path(mlx_lm_lora.__file__).parent / "trainer" / "sft_trainer.py"
    assert 'iters: int = field(default=100,' in source.read_text() and rt.PREFERENCE_ITERS == 100
    assert '"iters": None,' in (Path(mlx_lm_lora.__file__).parent / "train.py").read_text()


@pytest.mark.parametrize("mode", ["dpo", "grpo"])
def test_probe_of_a_preference_mode_gives_its_time(mode):
    out = _probe("--train-mode", mode, "--memory", "36GB", "--chip", "M3 Max", "--iters", "200")
    time = out["time"]
    assert time["iters"] == 200 and time["basis"] == "M3 Max, fitted efficiency"
    phases = time["widest_step"]["phases"]
    assert ("generation" in phases) == (mode == "grpo") and phases["reference"] > 0
    result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--train-mode", mode, "--memory", "36GB",
                                      "--chip", "M3 Max", "--iters", "200"])
    assert result.exit_code == 0 and "for 200 iterations on an M3 Max" in " ".join(result.output.split())


def test_evaluations_are_counted_as_train_evaluates_without_listing_them():
    from mlxfit.estimate.run_time import evaluations

    for iters in range(1, 300):
        for every in range(1, 40):
            assert evaluations(iters, every) == len({1, iters} | set(range(every, iters + 1, every)))
    assert evaluations(5 * 10**11, 200) == 2_500_000_001  # a plan's batch 2 of a batch of 10^9: no list of them


def test_a_chips_rate_is_its_cores_at_the_rate_measured_for_its_generations_core():
    table = st.chip_table()["gemm_per_core"]
    for c in st.chips():
        measured = table[st.generation(c.name)]
        assert measured["source"].startswith("https://github.com/") and measured["measured_on"]
        assert c.gemm_operations == pytest.approx(c.gpu_cores * measured["tflops_per_core"] * 1e12)
    # The chips measured give back their measurement: the M4 Max's 40 cores, 13.27 TFLOPS.
    assert st.find_chip("M4 Max").gemm_operations == pytest.approx(13.27e12, rel=1e-3)
    assert st.find_chip("M2 Ultra").gemm_operations == pytest.approx(20e12, rel=1e-3)
