"""What mlx-lm-lora's full fine-tune trains outside the blocks (the embedding, an untied
head, the final norm), and its bytes: read by the preference estimate and by the
miniatures that count its logits."""

from __future__ import annotations

import math
from functools import lru_cache

from ..model.resolve import ModelInfo


def trains_every_parameter(model: ModelInfo, training) -> bool:
    """mlx-lm-lora's full fine-tune of a base not quantized: train.py build_lora_config gives
    None for --train-type full and utils.py from_pretrained freezes nothing without it, so
    every parameter trains (the embedding, an untied head and the final norm beside every
    block), whatever --num-layers says (pinned in tests/test_preference.py). mlx-lm's own
    full fine-tune (mlx_lm/lora.py) unfreezes the last --num-layers blocks only."""
    return training.fine_tune_type == "full" and not (training.quantize or model.quantized)


def outside_blocks(model: ModelInfo) -> tuple:
    """((shape, itemsize), ...) of the parameters outside the blocks: the embedding, an
    untied head and the final norm."""
    return _outside_blocks(model.config_key)


@lru_cache(maxsize=64)
def _outside_blocks(config_key: str) -> tuple:
    from ..model import lazy_model

    base = lazy_model.model_for_key(config_key)
    blocks = {id(a) for i in range(len(base.layers)) for _, a in lazy_model.block_arrays(base, i)}
    return tuple((tuple(a.shape), a.dtype.size) for _, a in lazy_model.block_arrays(base, None) if id(a) not in blocks)


def vocabulary_training(model: ModelInfo, training) -> tuple[int, int, int]:
    """(weights, optimizer state, gradients) in bytes of the embedding, an untied head and
    the final norm where mlx-lm-lora trains them (trains_every_parameter), 0 elsewhere. The
    optimizer's state is in the parameter's dtype (mlx/optimizers init_single: zeros_like);
    the gradients are alive from the loss's backward (the head's is its first product) to
    the update."""
    if not trains_every_parameter(model, training):
        return 0, 0, 0
    from .detailed import optimizer_state_elements

    arrays = outside_blocks(model)
    weights = sum(math.prod(shape) * size for shape, size in arrays)
    state = sum(optimizer_state_elements(training.optimizer, [shape]) * size for shape, size in arrays)
    return weights, state, weights
