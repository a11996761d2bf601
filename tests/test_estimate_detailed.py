"""Each exact part of the breakdown equals the real arrays of the model mlx-lm trains."""

import dataclasses

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxfit.estimate.detailed import BACKENDS, estimate, features, optimizer_state_elements, weight_bytes
from mlxfit.measure.build import prepare_for_training, quantize, random_model
from mlxfit.measure.steps import make_optimizer
from mlxfit.model.resolve import _from_config, from_catalog
from mlxfit.model.training import OPTIMIZERS, TrainingConfig
from tiny_configs import TINY

ARCHS = ["llama", "llama_untied_bias", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "mixtral"]


def tiny(name, dtype="bfloat16"):
    config = dict(TINY[name], torch_dtype=dtype)
    return config, _from_config(name, "local", config)


def trained_model(config, training):
    model = random_model(config)
    if training.quantize:
        model = quantize(model, config, training)
    prepare_for_training(model, training)
    mx.eval(model.parameters())
    return model


def nbytes(tree):
    return sum(v.nbytes for _, v in tree_flatten(tree))


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("fine_tune_type", ["lora", "full"])
def test_weights_and_trainable_match_the_model(name, fine_tune_type):
    config, info = tiny(name)
    training = TrainingConfig(fine_tune_type=fine_tune_type, num_layers=-1, rank=4)
    model = trained_model(config, training)
    f = features(info, training)
    trainable = nbytes(model.trainable_parameters())
    assert f["trainable_bytes"] == trainable
    # Full fine-tuning trains the base weights themselves; LoRA adds adapters beside them.
    adapters = 0 if fine_tune_type == "full" else trainable
    assert f["base_bytes"] == nbytes(model.parameters()) - adapters


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma3_text", "phi3"])
def test_dora_adds_its_magnitude_vector(name):
    config, info = tiny(name)
    training = TrainingConfig(fine_tune_type="dora", num_layers=1, rank=8)
    model = trained_model(config, training)
    assert features(info, training)["trainable_bytes"] == nbytes(model.trainable_parameters())


@pytest.mark.parametrize("grad_checkpoint", [False, True])
def test_qdora_keeps_every_adapted_layers_dequantized_weight(grad_checkpoint):
    """dora.py on a quantized base: y = x @ dequantize(w).T keeps the dequantized weight for the
    backward, in every trained block (under checkpointing too: compile merges the recompute's
    dequantize of the frozen weights with the forward's). The count is mlx-lm's own DoRA layers'
    weights in the model dtype, plus one float32 adapted weight being built; a real QDoRA step
    (its evaluation synchronous) holds at least those weights more than the same QLoRA step."""
    from mlx_lm.tuner.dora import DoRALinear

    from mlxfit.measure.steps import batches, evaluated_synchronously, full_length_dataset, run_steps

    config, info = tiny("llama", "float32")
    training = TrainingConfig(fine_tune_type="dora", quantize=True, num_layers=2, rank=4, batch_size=1,
                              max_seq_length=32, grad_checkpoint=grad_checkpoint)
    model = trained_model(config, training)
    doras = [m for _, m in model.named_modules() if isinstance(m, DoRALinear)]
    dequantized = sum(m._dequantized_weight().nbytes for m in doras)
    largest = max(m._dequantized_weight().size for m in doras) * 4
    assert doras and features(info, training)["qdora_weights_bytes"] == dequantized + largest
    assert features(info, TrainingConfig(fine_tune_type="dora", num_layers=2, rank=4))["qdora_weights_bytes"] == 0
    del doras

    def step_peak(training):
        model = trained_model(config, training)
        data = full_length_dataset(1, 32, config["vocab_size"])
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        with evaluated_synchronously():
            records = run_steps(model, training, batches(data, training), max_steps=4)
        return max(r.peak_bytes for r in records) - before

    qlora = dataclasses.replace(training, fine_tune_type="lora")
    assert step_peak(training) - step_peak(qlora) >= dequantized


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "mixtral", "phi3"])
@pytest.mark.parametrize("bits, group_size", [(4, 64), (8, 32)])
def test_quantized_base_matches_mlx_lm_convert(name, bits, group_size):
    config, info = tiny(name)
    training = TrainingConfig(quantize=True, bits=bits, group_size=group_size, num_layers=-1)
    model = trained_model(config, training)
    f = features(info, training)
    assert f["base_bytes"] == nbytes(model.parameters()) - nbytes(model.trainable_parameters())


def test_layers_not_divisible_by_the_group_stay_unquantized():
    config = dict(TINY["llama"], intermediate_size=96, torch_dtype="bfloat16")  # 96 % 64 != 0
    info = _from_config("x", "local", config)
    training = TrainingConfig(quantize=True, num_layers=-1)
    model = trained_model(config, training)
    assert weight_bytes(info, training) == nbytes(model.parameters()) - nbytes(model.trainable_parameters())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("fine_tune_type", ["lora", "full"])
def test_optimizer_state_matches_mlx_optimizers(optimizer, fine_tune_type):
    config, info = tiny("qwen3")
    training = TrainingConfig(fine_tune_type=fine_tune_type, optimizer=optimizer, num_layers=1)
    model = trained_model(config, training)
    opt = make_optimizer(optimizer)
    opt.init(model.trainable_parameters())
    state = {k: v for k, v in opt.state.items() if k not in ("step", "learning_rate")}
    assert features(info, training)["optimizer_bytes"] == nbytes(state)


def test_optimizer_state_keeps_the_parameter_dtype():
    """mlx.optimizers use zeros_like: bf16 weights get bf16 Adam moments (not fp32)."""
    assert optimizer_state_elements("adam", [(4, 8)]) == 64
    config, info = tiny("llama", "bfloat16")
    training = TrainingConfig(fine_tune_type="full", num_layers=1)
    model = trained_model(config, training)
    opt = make_optimizer("adam")
    opt.init(model.trainable_parameters())
    dtypes = {v.dtype for k, v in tree_flatten(opt.state) if k.endswith((".m", ".v"))}
    assert dtypes == {mx.bfloat16}


def test_only_the_trained_blocks_carry_activations():
    _, info = tiny("llama")
    one = features(info, TrainingConfig(num_layers=1, batch_size=2, max_seq_length=65))
    two = features(info, TrainingConfig(num_layers=2, batch_size=2, max_seq_length=65))
    assert two["act_inter_bytes"] == 2 * one["act_inter_bytes"] > 0
    assert two["scores_bytes"] == 2 * one["scores_bytes"] == 2 * 2 * 4 * 64 * 64 * 2
    # The block being differentiated needs its working set once, at any depth.
    assert two["scores_once_bytes"] == one["scores_once_bytes"] == one["scores_bytes"]


def test_checkpointing_keeps_block_inputs_only():
    _, info = tiny("llama")
    plain = features(info, TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=129))
    gc = features(info, TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=129, grad_checkpoint=True))
    n, h = info.architecture.num_layers, info.architecture.hidden_size
    assert gc["act_h_bytes"] * n == plain["act_h_bytes"] and gc["scores_bytes"] * n == plain["scores_bytes"]
    assert gc["checkpoint_bytes"] == 2 * 128 * h * (n + 1) * 2 and plain["checkpoint_bytes"] == 0


@pytest.mark.parametrize("name, fine_tune_type, keys, gc, ahead", [
    ("qwen3", "full", None, False, True),  # traced: dP and dS allocated while the loss's buffers live
    ("qwen3", "full", None, True, False),  # checkpointed: the recomputed forward pass comes first
    ("qwen3", "lora", None, False, False),  # o, gate, up, down adapted: the loss's buffers freed first
    ("qwen3", "lora", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.down_proj"), False, False),  # o, gate, down: traced, freed first too
    ("phi3", "lora", None, False, True),  # o, gate_up, down: traced overlapping
    ("phi3", "dora", None, False, True),
    ("llama", "lora", ("self_attn.q_proj", "self_attn.v_proj"), False, True),  # no adapter after the attention
])
def test_the_last_blocks_attention_backward_runs_ahead_into_the_loss(name, fine_tune_type, keys, gc, ahead):
    """mlxfit/estimate/detailed.py ahead_of_loss, as benchmarks/trace_peak.py showed it on the CPU."""
    _, info = tiny(name)
    training = TrainingConfig(fine_tune_type=fine_tune_type, lora_keys=keys, num_layers=2, batch_size=1,
                              max_seq_length=129, grad_checkpoint=gc)
    f = features(info, training)
    assert f["scores_ahead_bytes"] == (f["scores_once_bytes"] if ahead else 0) and f["scores_once_bytes"] > 0


def test_only_fused_projections_split_their_outputs():
    for name, fused in (("phi3", True), ("llama", False)):
        _, info = tiny(name)
        f = features(info, TrainingConfig(num_layers=1, batch_size=1, max_seq_length=33))
        assert (f["split_bytes"] > 0) == fused
        assert (f["frozen_fused_bytes"] > 0) == fused


def test_a_wide_full_fine_tune_peaks_at_the_update():
    """Short sequences and many trainable weights: the update, not the backward pass."""
    _, info = tiny("llama", "float32")
    training = TrainingConfig(fine_tune_type="full", num_layers=-1, batch_size=1, max_seq_length=8, optimizer="adafactor")
    b = estimate(info, training, "cpu")
    assert b.features["phase"] == "update"
    assert b.parts["activations"] == 0
    # Adafactor: 3.7 blocks' worth plus 0.93 per trained block, capped at 2 times all trainable
    # weights, which a model this shallow reaches.
    blocks = b.features["trained_blocks"]
    assert (3.7 + 0.93 * blocks) / blocks > 2.0
    assert b.parts["gradients"] + b.parts["update temporaries"] == int(2.0 * b.features["trainable_bytes"])


@pytest.mark.parametrize("name", ["llama", "phi3", "qwen3"])
def test_an_mlp_as_wide_as_the_model_is_still_counted(name):
    """gate, up and down are all hidden x hidden: the down projection is told by its name."""
    config = dict(TINY[name], torch_dtype="float32")
    config["intermediate_size"] = config["hidden_size"]
    block = _from_config(name, "local", config).architecture.blocks[0]
    assert block.intermediate == config["hidden_size"]


def test_logits_grow_with_vocabulary():
    info = from_catalog("Qwen/Qwen2.5-0.5B-Instruct")
    f = features(info, TrainingConfig(batch_size=1, max_seq_length=1025))
    assert f["logits_bytes"] == 1 * 1024 * 151936 * 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_breakdown_adds_up_and_is_positive(backend):
    info = from_catalog("Qwen/Qwen3-0.6B")
    b = estimate(info, TrainingConfig(), backend)
    assert b.peak_bytes == sum(b.parts.values()) and all(v >= 0 for v in b.parts.values())
    assert b.to_dict()["predicted_peak_bytes"] == b.peak_bytes


def test_sizing_does_not_depend_on_what_was_sized_before():
    """The walks, adapters and per-block figures kept between estimates (a plan
    sizes a few hundred runs of one model) give each run the bytes it gets alone."""
    from dataclasses import replace

    from mlxfit.estimate import detailed as est
    from mlxfit.model import lazy_model

    runs = [TrainingConfig(fine_tune_type=f, num_layers=n, rank=r, quantize=q, grad_checkpoint=c, lora_keys=k)
            for f, n, r, q, c, k in [
                ("lora", 2, 4, False, False, None), ("dora", -1, 8, True, True, None), ("full", 1, 8, False, False, None),
                ("lora", -1, 8, True, False, ("self_attn.q_proj",)), ("dora", 1, 4, False, True, None),
            ]]

    def fresh():
        for cache in (est._counted, est._totals, lazy_model.model_for_key):
            cache.cache_clear()
        return tiny("qwen3")[1]

    info = fresh()
    in_turn = [estimate(info, t).features for t in runs]
    alone = []
    for t in runs:
        info = fresh()
        alone.append(estimate(info, t).features)
    assert in_turn == alone
    sliced = replace(info, slice_blocks=1, architecture=replace(info.architecture, blocks=info.architecture.blocks[-1:]))
    assert estimate(sliced, runs[2]).features["base_bytes"] < alone[2]["base_bytes"]
