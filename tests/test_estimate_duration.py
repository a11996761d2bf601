"""How long a measurement will take, said before it starts (mlxfit/estimate/duration.py),
with a rate recorded on this machine: no timing here."""

import json
from pathlib import Path

from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate import duration
from mlxfit.model.resolve import _from_config
from mlxfit.model.training import TrainingConfig

# mlxfit.measure.rate.matmul_rate("bfloat16") on this 2-core Linux box (MLX's CPU backend):
# 2.7e9 operations per second. Step 1 of Qwen3-0.6B at 1 x 128 tokens then took 111 s
# against 101 s expected.
RECORDED_BF16_RATE = 2.7e9

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 256,
         "tie_word_embeddings": True, "torch_dtype": "float32"}


def by_hand(training: TrainingConfig) -> int:
    """The step's operations of the tiny llama worked out from its config."""
    h, inter, layers, vocab, heads, kv = 64, 128, 2, 256, 4, 2
    d = h // heads
    linear = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * inter  # q, k, v, o; gate, up, down
    T = training.max_seq_length - 1
    N = training.batch_size * T
    attention = 4 * heads * d * T
    forward = N * (layers * (2 * linear + attention) + 2 * vocab * h)
    input_grads = N * (2 * vocab * h + layers * (2 * linear + 2 * attention))
    trainable = layers * (linear + 2 * h)  # full fine-tuning: the blocks' weights and their two norms
    return forward + input_grads + 2 * N * trainable


def test_a_steps_operations_are_counted_from_the_architecture():
    model = _from_config("tiny", "local", LLAMA)
    full = TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2, max_seq_length=33)
    assert duration.step_operations(model, full) == by_hand(full)
    checkpointed = TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=2, max_seq_length=33,
                                  grad_checkpoint=True)
    extra = duration.step_operations(model, checkpointed) - duration.step_operations(model, full)
    assert extra == 2 * 32 * 2 * (2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 4 * 4 * 16 * 32)
    # LoRA trains a few adapters: far fewer weight gradients than full fine-tuning.
    lora = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=33)
    assert duration.step_operations(model, lora) < duration.step_operations(model, full)


def test_the_expected_time_is_steps_times_operations_over_the_rate():
    model = _from_config("tiny", "local", LLAMA)
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=33)
    e = duration.expect(model, training, None, 1e6, "float32", 3, 6)
    ops = duration.step_operations(model, training)
    assert (e.low_seconds, e.high_seconds) == (3 * ops / 1e6, 6 * ops / 1e6)
    assert duration.too_long(e, timeout=e.low_seconds + 1) is None
    refusal = duration.too_long(e, timeout=e.low_seconds / 2)
    assert refusal.startswith("refusing to measure: 3-6 steps") and "--slice" in refusal
    assert json.dumps(e.to_dict())


def test_probe_measure_says_it_would_run_past_the_timeout_and_builds_nothing(monkeypatch):
    import mlxfit.measure.parent
    import mlxfit.measure.rate

    monkeypatch.setattr(mlxfit.measure.rate, "matmul_rate", lambda *a, **k: RECORDED_BF16_RATE)
    monkeypatch.setattr(mlxfit.measure.parent, "measure", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    monkeypatch.setattr(mlxfit.measure.parent, "run_child", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    args = ["probe", "--model", "Qwen/Qwen3-0.6B", "--memory", "64GB", "--batch-size", "1", "--max-seq-length", "128",
            "--measure", "--timeout", "60"]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "80"})
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "refusing to measure: 3-6 steps" in text and "(bfloat16 products, measured here)" in text
    assert "past --timeout 60 s" in text and "--slice" in text and "Traceback" not in text
    # The default run on a small budget is measured by slices: said too, with no --slice to offer.
    result = CliRunner().invoke(cli, ["probe", "--measure", "--memory", "24GB"], env={"COLUMNS": "80"})
    assert result.exit_code == 1 and "over 4 slices" in " ".join(result.output.split()), result.output


def test_a_short_expectation_reads_as_a_person_would_say_it():
    """A tiny run was announced as 'about 0 s-0 s'."""
    from mlxfit.render.measurement import render_expectation
    from mlxfit.render.text import console

    def said(operations):
        e = duration.Expectation(steps=(3, 6), operations=operations, rate=1e9, dtype="float32")
        with console.capture() as captured:
            render_expectation(e)
        return " ".join(captured.get().split())

    assert said((1e8, 5e8)).startswith("Expect under a second:")
    assert said((3e10, 3.2e10)).startswith("Expect about 30 s-32 s:")
    assert said((3e10, 3.02e10)).startswith("Expect about 30 s:")


def test_a_long_steps_bound_never_reads_about_0_s(monkeypatch):
    """--steps 1000000 on a tiny model was announced as 'about 0 s-25.4 h'."""
    import mlxfit.measure.parent
    import mlxfit.measure.rate
    from mlxfit.errors import MlxfitError

    monkeypatch.setattr(mlxfit.measure.rate, "matmul_rate", lambda *a, **k: RECORDED_BF16_RATE)
    monkeypatch.setattr(mlxfit.measure.parent, "measure", lambda *a, **k: (_ for _ in ()).throw(MlxfitError("not built here")))
    tiny = str(Path(__file__).parent.parent / "examples" / "tiny-llama")
    args = ["probe", "--model", tiny, "--num-layers", "-1", "--batch-size", "1", "--max-seq-length", "8", "--measure", "--steps", "1000000", "--timeout", "100000000"]
    result = CliRunner().invoke(cli, args, env={"COLUMNS": "80"})
    text = " ".join(result.output.split())
    assert "not built here" in text, result.output
    assert "Expect under a second to about " in text and "about 0 s" not in text
    assert "3-1000000 steps" in text
