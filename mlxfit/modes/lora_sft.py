"""mlx-lm-lora's own SFT (mlx_lm_lora/trainer/sft_trainer.py train_sft): the step is
mlx-lm's (default_loss, compiled, batches padded alike), so it is sized as mlx-lm's
SFT; what differs is the loading: with --load-in-Nbits the base is quantized lazily,
and an untied head's full-precision weight is still alive at the first step's peak
(estimate/preference.py lazy_head_bytes)."""

from __future__ import annotations

from dataclasses import dataclass

from .sft import SFT


@dataclass(frozen=True)
class LoraSFT(SFT):
    """mlx-lm's SFT step (its range: SFT.evidence_range) run by mlx-lm-lora's trainer."""

    @property
    def trainer_mode(self) -> str:
        return "sft"

    def batch_iterator(self):
        from mlx_lm_lora.trainer.datasets import CacheDataset
        from mlx_lm_lora.trainer.sft_trainer import iterate_batches

        # train.py run() wraps the rows so that (tokens, offset) is what the iterator reads.
        return lambda dataset, batch_size, max_seq_length: iterate_batches(CacheDataset(dataset), batch_size,
                                                                           max_seq_length)

    def synthesized(self, rng, vocab: int, n: int, request: dict) -> list:
        # sft_trainer.py iterate_batches pads to 1 + 32 * ceil(longest / 32): L - 1 tokens
        # make a batch L wide when L is such a width.
        L = request["length"]
        return [(rng.integers(1, vocab, max(L - 1, 1)).tolist(), 0) for _ in range(n)]

    def train(self, *, model, reference, optimizer, dataset, common, run, callback, tokenizer):
        from mlx_lm_lora.trainer.sft_trainer import SFTTrainingArgs, train_sft

        train_sft(model=model, optimizer=optimizer, train_dataset=dataset, val_dataset=None,
                  args=SFTTrainingArgs(**common, seq_step_size=run["seq_step_size"]), training_callback=callback)


MODE = LoraSFT("lora_sft", order=5, data_kind="text", step_is_mlx_lm=True, lazy_head_at_peak=True)
