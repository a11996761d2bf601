"""mlxfit's defaults are mlx-lm's: an mlx-lm upgrade that changes them fails here."""

import mlx_lm.lora
import pytest
from mlx_lm.tuner.trainer import TrainingArgs

from mlxfit.errors import BadInput
from mlxfit.model.resolve import DEFAULT_MODEL
from mlxfit.model.training import FINE_TUNE_TYPES, OPTIMIZERS, TrainingConfig, defaults


def test_defaults_match_mlx_lm_lora():
    ours, theirs = defaults(), mlx_lm.lora.CONFIG_DEFAULTS
    for key in ("fine_tune_type", "optimizer", "num_layers", "batch_size", "max_seq_length", "grad_checkpoint", "grad_accumulation_steps"):
        assert ours[key] == theirs[key], key
    assert {k: ours[k] for k in ("rank", "scale", "dropout")} == theirs["lora_parameters"]
    assert DEFAULT_MODEL.lower() == theirs["model"].lower()


def test_choices_match_mlx_lm_parser():
    parser = mlx_lm.lora.build_parser()
    choices = {a.dest: a.choices for a in parser._actions if a.choices}
    assert tuple(choices["fine_tune_type"]) == FINE_TUNE_TYPES
    assert tuple(choices["optimizer"]) == OPTIMIZERS
    assert set(mlx_lm.lora.CONFIG_DEFAULTS["optimizer_config"]) == set(OPTIMIZERS)


def test_trainer_defaults_agree():
    args = TrainingArgs()
    assert args.grad_checkpoint is False and args.grad_accumulation_steps == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch-size must be at least 1"),
        ({"max_seq_length": -5}, "max-seq-length must be at least 1"),
        ({"num_layers": 0}, "num-layers must be positive"),
        ({"fine_tune_type": "full", "quantize": True}, "QLoRA trains adapters"),
    ],
)
def test_bad_training_values(kwargs, message):
    with pytest.raises(BadInput, match=message):
        TrainingConfig(**kwargs)


def test_too_many_layers_message_matches_mlx_lm():
    with pytest.raises(BadInput, match="Requested to train 40 layers but the model only has 28 layers"):
        TrainingConfig(num_layers=40).layers_trained(28)
