"""mlx-lm-lora's ORPO (mlx_lm_lora/trainer/orpo_trainer.py): chosen and rejected through
the policy, no reference; its two cross-entropies run their backward one sequence at a time."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Mode


@dataclass(frozen=True)
class ORPO(Mode):
    def batch_iterator(self):
        from mlx_lm_lora.trainer.orpo_trainer import iterate_orpo_batches

        return iterate_orpo_batches

    def train(self, *, model, reference, optimizer, dataset, common, run, callback, tokenizer):
        from mlx_lm_lora.trainer.orpo_trainer import ORPOTrainingArgs, train_orpo

        train_orpo(model=model, optimizer=optimizer, train_dataset=dataset, val_dataset=None,
                   args=ORPOTrainingArgs(**common, beta=run["beta"], seq_step_size=run["seq_step_size"]),
                   training_callback=callback)


MODE = ORPO("orpo", order=3, pairs=True, counted_on_miniature=True, data_kind="chosen/rejected", lazy_head_at_peak=True)
