"""The rate of mlx-lm's decoding loop (measure/decode_rate.py) and GRPO's rollout counting
it (estimate/step_time.py): the plumbing and the arithmetic, never a timing; measured for
GRPO alone, without transformers, never before a measuring child."""

from __future__ import annotations

import inspect
import json
from dataclasses import replace

import pytest

from mlxfit.estimate import step_time as st
from mlxfit.measure import decode_rate, rate
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


def decoding_step_graph(blocks: int, path, lora: bool = False) -> str:
    """MLX's graph of one decoding step of mlx-lm's BatchGenerator on the minimal Llama
    of `blocks` blocks (every linear LoRA-adapted with `lora`), with GRPO's sampler, as
    mx.export_to_dot writes it."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from mlxfit.measure.build import materialize, random_model
    from mlxfit.model.preference import GRPO_SAMPLING

    model = random_model({**decode_rate.decode_config("float32"), "num_hidden_layers": blocks}, mx.float32)
    materialize(model)
    if lora:
        from mlx_lm.tuner.utils import linear_to_lora_layers

        model.freeze()
        linear_to_lora_layers(model, blocks, {"rank": 8, "scale": 20.0, "dropout": 0.0})
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
    assert decode_ops(from_config("m", decode_rate.decode_config("float32"))) == DECODE_OPS + DECODE_BLOCK_OPS


def test_a_lora_adapters_decoding_operations_are_counted_from_mlxs_graph(tmp_path):
    """Counted as the block's are (views included): its two products, their flattening and
    unflattening, the scale's broadcast, the multiply and the add, beyond the layer's own."""
    from mlxfit.estimate.step_work import ADAPTER_FORWARD_OPS, DECODE_BLOCK_OPS, DECODE_OPS

    for blocks in (1, 2):
        graph = decoding_step_graph(blocks, tmp_path / f"{blocks}.dot", lora=True)
        assert graph.count("shape=rectangle") == DECODE_OPS + blocks * (DECODE_BLOCK_OPS + 7 * ADAPTER_FORWARD_OPS)


def timed_step_graph(blocks: int, path) -> str:
    """MLX's graph of one step of the loop decode_rate times (without mlx_lm.generate)."""
    import mlx.core as mx

    from mlxfit.model.lazy_model import build

    model = build({**decode_rate.decode_config("float32"), "num_hidden_layers": blocks})
    mx.eval(model.parameters())
    model.eval()
    loop = decode_rate.DecodingLoop(model, decode_rate.grpo_sampler(), mx.array([1]))
    loop.step()
    mx.export_to_dot(str(path), *decode_rate.decoding_step(model, loop.cache, loop.sampler, loop.next_tokens))
    return path.read_text()


def test_the_timed_loop_is_mlx_lms_decoding_step_operation_for_operation(tmp_path):
    """decode_rate times mlx-lm's step with its pieces (mlx_lm.generate imports transformers):
    the same source lines, the same cache, the same operations in MLX's graph."""
    from mlx_lm.generate import GenerationBatch, _merge_caches

    from mlxfit.estimate.step_work import DECODE_BLOCK_OPS, DECODE_OPS

    step = inspect.getsource(GenerationBatch._step)
    for line in ("logits = logits[:, -1, :]", "self._next_logprobs = list(logprobs)",
                 "mx.async_eval(self._next_tokens, self._next_logprobs, token_context)",
                 "mx.eval(inputs, self._current_logprobs)", "inputs = inputs.tolist()"):
        assert line in step
    assert "self._step()" in inspect.getsource(GenerationBatch.__init__)
    assert "caches[0][i].merge([c[i] for c in caches])" in inspect.getsource(_merge_caches)
    for blocks in (1, 2):
        timed = timed_step_graph(blocks, tmp_path / f"timed{blocks}.dot")
        assert timed.count("shape=rectangle") == DECODE_OPS + DECODE_BLOCK_OPS * blocks
        assert timed.count("shape=rectangle") == decoding_step_graph(blocks, tmp_path / f"{blocks}.dot").count(
            "shape=rectangle")


def test_an_operation_of_the_loop_is_the_step_less_its_work_over_its_operations(monkeypatch):
    from mlxfit.estimate.step_work import decode_ops

    assert decode_rate.decode_op_seconds(3e-3, 1e-3, 200) == pytest.approx(1e-5)
    assert decode_rate.decode_op_seconds(1e-3, 2e-3, 200) == 0.0  # a busy moment: never a negative cost
    monkeypatch.setattr(decode_rate, "decode_step_seconds", lambda dtype: 1e-2)
    minimal = from_config("m", decode_rate.decode_config("float32"))
    work = st.decode_work_seconds(minimal, st.measured_speed(RATES))
    assert 0 < work < 1e-2
    assert decode_rate.measured_decode_op("float32", RATES) == pytest.approx((1e-2 - work) / decode_ops(minimal))


def test_measure_rates_leaves_the_decoding_loop_out(monkeypatch):
    """The seven rates every estimate reads never run mlx-lm's decoding loop: a GRPO run asks it apart."""
    monkeypatch.setattr(rate, "matmul_rate", lambda *a: 1e9)
    monkeypatch.setattr(rate, "elementwise_rate", lambda *a: 1e8)
    monkeypatch.setattr(rate, "transcendental_rate", lambda *a: 1e6)
    monkeypatch.setattr(rate, "operation_seconds", lambda: 1e-5)
    monkeypatch.setattr(rate, "softmax_rate", lambda *a: 5e5)
    monkeypatch.setattr(rate, "root_rate", lambda *a: 2e7)
    monkeypatch.setattr(rate, "loss_rate", lambda *a: 3e7)
    monkeypatch.setattr(decode_rate, "decode_step_seconds", lambda *a: pytest.fail("the decoding loop was timed"))
    assert rate.measure_rates("float32") == replace(RATES, decode_op=None, root=2e7, loss=3e7)
    assert rate.machine_key("float32").endswith("|loss")  # rates kept before the loss's: measured again
    speed = st.measured_speed(RATES)
    assert speed.decode_op_seconds == 2e-5 and speed.to_dict()["decode_op_seconds"] == 2e-5
    assert st.corrected(speed, 2.0, {}).decode_op_seconds == pytest.approx(4e-5)
    # Rates without the loop's (every mode but GRPO, a named Mac): none.
    assert st.measured_speed(rate.MachineRates(1e9, 1e8, 1e6, 1e-5, 5e5)).decode_op_seconds == 0.0


def test_the_cache_keeps_the_decoding_rate_apart(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "cache"))
    seen = []
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda dtype, rates: seen.append(rates) or 2e-5)
    assert decode_rate.decode_rate("float32", RATES) == 2e-5
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda *a: pytest.fail("measured again"))
    assert decode_rate.decode_rate("float32", RATES) == 2e-5
    assert seen == [RATES]  # its work taken at the run's rates
    assert (tmp_path / "cache" / "decode_loop_rate.json").is_file()
    assert not (tmp_path / "cache" / "machine_rates.json").exists()


def test_the_decoding_step_is_timed_as_grpos_rollout_runs_it():
    from mlx_lm_lora.trainer import grpo_trainer

    from mlxfit.model.preference import GRPO_SAMPLING

    from mlx_lm.generate import BatchGenerator

    source = inspect.getsource(grpo_trainer.generate_grpo)
    assert "BatchGenerator(" in source and "next_generated()" in source
    assert "with mx.stream(self._stream)" in inspect.getsource(BatchGenerator.next_generated)
    assert "make_sampler(temperature, top_p=top_p, min_p=min_p, top_k=top_k)" in source
    assert GRPO_SAMPLING["temperature"] == grpo_trainer.GRPOTrainingArgs().temperature
    assert "make_sampler(" in inspect.getsource(decode_rate.grpo_sampler)
    seconds = decode_rate.decode_step_seconds("float32")  # runs the loop on the minimal Llama
    assert isinstance(seconds, float) and seconds > 0


def test_grpo_generation_counts_each_decoding_steps_operations_at_the_loops_rate(tiny):
    from mlx_lm.tuner.lora import LoRALinear

    from mlxfit.estimate.step_work import decode_ops

    training = TrainingConfig(num_layers=1, batch_size=2, max_seq_length=4)
    speed = st.measured_speed(RATES)
    # The trained block's 7 LoRA adapters add their forward's operations each step.
    assert "(self.dropout(x) @ self.lora_a) @ self.lora_b" in inspect.getsource(LoRALinear.__call__)
    ops = decode_ops(tiny) + 7 * 9
    assert decode_ops(tiny) == 64 + 2 * 132
    one = st.decode_step_seconds(tiny, training, speed, 2)
    assert one == pytest.approx(st.decode_work_seconds(tiny, speed, 2) + ops * 2e-5)
    assert st.decode_step_seconds(tiny, replace(training, fine_tune_type="full"), speed, 2) == pytest.approx(
        one - 7 * 9 * 2e-5)
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


def probe_json(*args):
    from click.testing import CliRunner

    from mlxfit.cli.main import cli

    result = CliRunner().invoke(cli, ["probe", *args, "--num-layers", "-1", "--max-seq-length", "32", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("mode", [None, "dpo", "orpo", "cpo"])
def test_an_estimate_of_another_mode_never_times_the_decoding_loop(tiny, tmp_path, monkeypatch, mode):
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda *a: pytest.fail("the decoding loop was timed"))
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: replace(RATES, decode_op=None))
    answer = probe_json("--model", str(tmp_path), *(("--train-mode", mode) if mode else ()))
    assert answer["time"]["step_seconds"] > 0


def test_a_grpo_estimate_times_the_decoding_loop_once(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: replace(RATES, decode_op=None))
    seen = []
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda dtype, rates: seen.append(dtype) or 2e-5)
    args = ("--model", str(tmp_path), "--train-mode", "grpo", "--group-size", "2", "--max-completion-length", "8")
    first, again = probe_json(*args), probe_json(*args)
    assert seen == ["float32"] and first["time"] == again["time"]  # kept in the cache after the first
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda *a: 0.0)
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "another-cache"))
    assert probe_json(*args)["time"]["step_seconds"] < first["time"]["step_seconds"]  # the loop's rate is counted


def test_grpo_measure_times_the_decoding_loop_after_the_measuring_child(tiny, tmp_path, monkeypatch):
    """With --measure, nothing is timed before or around the measuring child (its signal
    handling, its lifeline): the loop's rate is asked when the run's time is, after it."""
    from mlxfit.measure import parent, preference

    order = []
    monkeypatch.setattr(rate, "measure_rates", lambda *a, **k: replace(RATES, decode_op=None))
    monkeypatch.setattr(decode_rate, "measured_decode_op", lambda *a: order.append("decoding loop") or 2e-5)
    monkeypatch.setattr(preference, "require_extra", lambda *a: None)
    measured = {"peak_bytes": 1, "step_peaks_bytes": [1], "load_peak_bytes": 1, "steps": 1, "seconds": 0.1,
                "compiled": False, "completion_lengths": [8], "trainer_peaks_gb": [0.0]}
    monkeypatch.setattr(parent, "run_child", lambda *a, **k: order.append("child") or {"measured": measured})
    probe_json("--model", str(tmp_path), "--train-mode", "grpo", "--group-size", "2", "--max-completion-length", "8",
               "--measure")
    assert order == ["child", "decoding loop"]
