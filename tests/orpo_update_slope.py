"""The compiled ORPO step's peak above its resident weights and Adam state, as mlx-lm-lora
builds it (orpo_trainer.py train_orpo: nn.value_and_grad over orpo_loss_from_model, then
optimizer.update, under mx.compile), in vocabulary x hidden matrices per matrix of growth
between two vocabularies. Run by tests/test_preference.py in a fresh process:

    python tests/orpo_update_slope.py tied|untied
"""

import sys
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models import llama
from mlx_lm_lora.trainer.orpo_trainer import orpo_loss_from_model


def peak(vocab: int, tied: bool) -> int:
    config = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, rms_norm_eps=1e-5,
                  tie_word_embeddings=tied)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    optimizer = optim.Adam(learning_rate=1e-5)
    optimizer.init(model.trainable_parameters())
    state = [model.state, optimizer.state, mx.random.state]
    value_and_grad = nn.value_and_grad(model, orpo_loss_from_model)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(*batch):
        (loss, *_), grad = value_and_grad(model, *batch)
        optimizer.update(model, grad)
        return loss

    chosen, rejected = mx.random.randint(0, vocab, (1, 16)), mx.random.randint(0, vocab, (1, 16))
    mask, scores = mx.ones((1, 16)), mx.ones((1,))
    mx.eval(chosen, rejected, mask, scores, state)
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    mx.eval(step(chosen, rejected, mask, mask, scores), state)
    return mx.get_peak_memory() - before


def most(vocab: int, tied: bool, repeats: int = 3) -> int:
    """The highest of a few peaks: MLX's CPU stream frees a buffer when the work using it is done,
    so on a busy machine a step can read lower than what the update holds (5.2 and 6.0 matrices
    read where quiet runs give 6.7-7.3); it never reads higher."""
    return max(peak(vocab, tied) for _ in range(repeats))


if __name__ == "__main__":
    tied = sys.argv[1] == "tied"
    print((most(8192, tied) - most(4096, tied)) / (4096 * 64 * 4))
