"""The validation pass mlx-lm runs at iteration 1 (and every steps_per_eval): forward only,
val_batches random batches of valid.jsonl, possibly wider than any training batch. Its peak
is counted (mlxfit/estimate/validation.py) and compared with the training step's."""

import inspect
import json

import pytest

from mlxfit.estimate.validation import VAL_BATCHES, forward_parts
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU, graph_peak
from test_probe_data import probe_json
from tiny_configs import TINY


def test_mlx_lm_validates_val_batches_random_batches_forward_only():
    from mlx_lm import lora
    from mlx_lm.tuner import trainer

    assert lora.CONFIG_DEFAULTS["val_batches"] == VAL_BATCHES
    assert "np.random.permutation" in inspect.getsource(trainer.iterate_batches)  # random order, also for evaluate
    source = inspect.getsource(trainer.evaluate)
    assert "model.eval()" in source and "value_and_grad" not in source and "num_batches" in source
    assert "it == 1" in inspect.getsource(trainer.train)  # the first pass, before any update


def _data(tmp_path, valid_words: int):
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [{"prompt": "the quick brown fox " * n, "completion": "jumps over the lazy dog"} for n in range(1, 9)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    valid = [{"prompt": "the quick brown fox " * valid_words, "completion": "jumps"} for _ in range(4)]
    (folder / "valid.jsonl").write_text("\n".join(json.dumps(r) for r in valid) + "\n")
    return folder




@pytest.mark.parametrize("valid_words, peaks", [(2, "training step"), (400, "validation")])
def test_probe_with_a_valid_set_says_which_moment_peaks(tmp_path, model_with_tokenizer, platform, valid_words, peaks):
    platform(LINUX_CPU)
    data = _data(tmp_path, valid_words)
    out = probe_json("--model", str(model_with_tokenizer), "--data", str(data), "--batch-size", "2",
                 "--max-seq-length", "2048", "--num-layers", "2")
    v = out["validation"]
    assert v["widest_batch_tokens"] == out["valid_data"]["worst_batch_tokens"]
    assert v["val_batches"] == VAL_BATCHES and v["valid_batches"] == 2 and v["widest_batch_certain"]
    assert v["peaks"] == peaks
    step = next(e for e in out["estimates"] if e["selected"])["predicted_peak_bytes"]
    assert v["training_step_peak_bytes"] == step
    assert (v["predicted_peak_bytes"] > step) == (peaks == "validation")
    if valid_words > 100:
        assert v["widest_batch_tokens"] > out["data"]["worst_batch_tokens"]


def test_a_folder_without_valid_jsonl_has_no_validation_moment(tmp_path, model_with_tokenizer, platform):
    platform(LINUX_CPU)
    data = _data(tmp_path, 2)
    (data / "valid.jsonl").unlink()
    out = probe_json("--model", str(model_with_tokenizer), "--data", str(data), "--batch-size", "2", "--num-layers", "2")
    assert "validation" not in out


def test_forward_only_peak_is_what_the_count_holds():
    """A forward pass of a real mlx-lm model without gradients, on the CPU with evaluation
    made synchronous (no allocation ahead of the worker), holds no more than the counted
    working set and at least its logits."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama
    from mlx_lm.tuner.trainer import default_loss

    config = dict(TINY["llama"], vocab_size=4096, torch_dtype="float32")
    model_info = from_folder_config(config)
    args = llama.ModelArgs.from_dict(config)
    model = llama.Model(args)
    mx.eval(model.parameters())
    B, N = 2, 257
    batch = mx.random.randint(0, 4096, (B, N), key=mx.random.key(3))
    lengths = mx.array([[0, N]] * B)
    with mx.stream(mx.cpu):
        held = graph_peak(default_loss, model, batch, lengths)
    parts = forward_parts(model_info, TrainingConfig(batch_size=B), N, "cpu")
    assert parts["logits"] <= held <= sum(parts.values())
    assert isinstance(model, nn.Module)


def from_folder_config(config):
    from mlxfit.model.resolve import _from_config

    return _from_config("tiny-llama", "local", config)
