"""The rate of mlx-lm's decoding loop (measure/rate.py) and GRPO's rollout counting it
(estimate/step_time.py): the plumbing and the arithmetic, never a timing."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace

import pytest

from mlxfit.estimate import step_time as st
from mlxfit.measure import rate
from mlxfit.model.resolve import from_config, resolve_model
from mlxfit.model.training import TrainingConfig

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "torch_dtype": "float32"}
RATES = rate.MachineRates(matmul=1e9, elementwise=1e8, transcendental=1e6, operation=1e-5, softmax=5e5,
                          decode_op=2e-5)


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    return resolve_model(str(tmp_path))


def decoding_step_graph(blocks: int, path) -> str:
    """MLX's graph of one decoding step of mlx-lm's BatchGenerator on the minimal Llama
    of `blocks` blocks, with GRPO's sampler, as mx.export_to_dot writes it."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlxfit.measure.build import materialize, random_model
    from mlxfit.model.preference import GRPO_SAMPLING

    model = random_model({**rate.decode_config("float32"), "num_hidden_layers": blocks}, mx.float32)
    materialize(model)
    model.eval()
    sampler = make_sampler(GRPO_SAMPLING["temperature"], top_p=GRPO_SAMPLING["top_p"], top_k=GRPO_SAMPLING["top_k"])
    generator = BatchGenerator(model, stop_tokens=None, sampler=sampler, completion_batch_size=1, prefill_batch_size=1)
    generator.insert([[1]], [8])
    generator.next_generated()
    batch = generator._generation_batch
    logits = model(batch._next_tokens[:, None], cache=batch.prompt_cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.export_to_dot(str(path), sampler(logprobs), logprobs)
    generator.close()
    return path.read_text()


def test_a_decoding_steps_operations_are_counted_from_mlxs_graph(tmp_path):
    from mlx_lm.generate import GenerationBatch

    from mlxfit.estimate.step_work import DECODE_BLOCK_OPS, DECODE_OPS, decode_ops

    step = inspect.getsource(GenerationBatch._step)
    assert "mx.logsumexp(logits" in step and "self.model(inputs[:, None], cache=self.prompt_cache)" in step
    for blocks in (1, 2):
        graph = decoding_step_graph(blocks, tmp_path / f"{blocks}.dot")
        assert graph.count("shape=rectangle") == DECODE_OPS + DECODE_BLOCK_OPS * blocks
    assert decode_ops(from_config("m", rate.decode_config("float32"))) == DECODE_OPS + DECODE_BLOCK_OPS


def test_an_operation_of_the_loop_is_the_step_less_its_work_over_its_operations(monkeypatch):
    from mlxfit.estimate.step_work import decode_ops

    assert rate.decode_op_seconds(3e-3, 1e-3, 200) == pytest.approx(1e-5)
    assert rate.decode_op_seconds(1e-3, 2e-3, 200) == 0.0  # a busy moment: never a negative cost
    monkeypatch.setattr(rate, "decode_step_seconds", lambda dtype: 1e-2)
    minimal = from_config("m", rate.decode_config("float32"))
    work = st.decode_work_seconds(minimal, st.measured_speed(RATES))
    assert 0 < work < 1e-2
    assert rate.measured_decode_op("float32", RATES) == pytest.approx((1e-2 - work) / decode_ops(minimal))


def test_measure_rates_carries_the_decoding_loops_rate(monkeypatch):
    monkeypatch.setattr(rate, "matmul_rate", lambda *a: 1e9)
    monkeypatch.setattr(rate, "elementwise_rate", lambda *a: 1e8)
    monkeypatch.setattr(rate, "transcendental_rate", lambda *a: 1e6)
    monkeypatch.setattr(rate, "operation_seconds", lambda: 1e-5)
    monkeypatch.setattr(rate, "softmax_rate", lambda *a: 5e5)
    seen = []
    monkeypatch.setattr(rate, "measured_decode_op", lambda dtype, rates: seen.append(rates) or 2e-5)
    assert rate.measure_rates("float32") == RATES
    assert seen[0].decode_op is None  # the products and passes are taken at the rates measured before it
    speed = st.measured_speed(RATES)
    assert speed.decode_op_seconds == 2e-5 and speed.to_dict()["decode_op_seconds"] == 2e-5
    assert st.corrected(speed, 2.0, {}).decode_op_seconds == pytest.approx(4e-5)
    # Rates stored before the loop's was measured: read as none.
    assert st.measured_speed(rate.MachineRates(1e9, 1e8, 1e6, 1e-5, 5e5)).decode_op_seconds == 0.0


def test_the_cache_keeps_the_decoding_rate_under_a_new_key(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: RATES)
    assert rate.machine_rates("float32") == RATES
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: pytest.fail("measured again"))
    assert rate.machine_rates("float32").decode_op == 2e-5
    assert rate.machine_key("float32").endswith("|decode")  # rates kept before it are measured again


def test_the_decoding_step_is_timed_as_grpos_rollout_runs_it():
    from mlx_lm_lora.trainer import grpo_trainer

    from mlxfit.model.preference import GRPO_SAMPLING

    source = inspect.getsource(grpo_trainer.generate_grpo)
    assert "BatchGenerator(" in source and "next_generated()" in source
    assert "make_sampler(temperature, top_p=top_p, min_p=min_p, top_k=top_k)" in source
    assert GRPO_SAMPLING["temperature"] == grpo_trainer.GRPOTrainingArgs().temperature
    seconds = rate.decode_step_seconds("float32")  # runs mlx-lm's loop on the minimal Llama
    assert isinstance(seconds, float) and seconds > 0


def test_grpo_generation_counts_each_decoding_steps_operations_at_the_loops_rate(tiny):
    from mlx_lm.tuner.lora import LoRALinear

    from mlxfit.estimate.step_work import decode_ops

    training = TrainingConfig(num_layers=1, batch_size=2, max_seq_length=4)
    speed = st.measured_speed(RATES)
    # The trained block's 7 LoRA adapters add their forward's operations each step.
    assert "(self.dropout(x) @ self.lora_a) @ self.lora_b" in inspect.getsource(LoRALinear.__call__)
    ops = decode_ops(tiny) + 7 * 5
    assert decode_ops(tiny) == 64 + 2 * 132
    one = st.decode_step_seconds(tiny, training, speed, 2)
    assert one == pytest.approx(st.decode_work_seconds(tiny, speed, 2) + ops * 2e-5)
    assert st.decode_step_seconds(tiny, replace(training, fine_tune_type="full"), speed, 2) == pytest.approx(
        one - 7 * 5 * 2e-5)
    # Where the loop's rate was not measured (a named Mac), at the cost of any operation.
    bare = replace(speed, decode_op_seconds=0.0)
    assert st.decode_step_seconds(tiny, training, bare, 2) == pytest.approx(
        st.decode_work_seconds(tiny, speed, 2) + ops * 1e-5)
    step = st.grpo_step_time(tiny, training, speed, prompt_length=4, group_size=4, completion_length=5)
    without = st.grpo_step_time(tiny, training, bare, prompt_length=4, group_size=4, completion_length=5)
    steps, _ = st.rollout_rounds(training, 4, 5)
    assert step.phases["generation"] - without.phases["generation"] == pytest.approx(steps * ops * 1e-5)
    assert step.operations == without.operations


def test_grpo_policy_runs_in_group_size_microbatches(tiny):
    """mlx-lm-lora's train_grpo scores and differentiates batch_size rows at a time: each
    microbatch dispatches its operations, and its gradients are scaled and summed."""
    from mlx_lm_lora.trainer import grpo_trainer

    from mlxfit.estimate.detailed import counted
    from mlxfit.estimate.step_work import OPTIMIZER_OPS, forward_work, step_work

    source = inspect.getsource(grpo_trainer._grpo_microbatches)
    assert "tree_map(lambda g: g * weight, grads)" in source and "tree_map(lambda a, b: a + b" in source
    training = TrainingConfig(num_layers=1, batch_size=2, max_seq_length=4)
    speed = st.measured_speed(RATES)
    step = st.grpo_step_time(tiny, training, speed, prompt_length=4, group_size=4, completion_length=5)
    policy = replace(training, max_seq_length=9)
    work = step_work(tiny, policy, 9, sequences=8)
    arrays = len(counted(tiny, policy)[1])
    per_chunk = work.ops - arrays * OPTIMIZER_OPS
    assert step.phases["dispatch"] == pytest.approx(
        (4 * per_chunk + arrays * OPTIMIZER_OPS + 4 * arrays * st.ACCUMULATE_OPS) * 1e-5)
    single = st._forward_seconds(tiny, 9, 8, speed)
    assert step.phases["reference"] - single == pytest.approx(3 * forward_work(tiny, 9, 8).ops * 1e-5)
