"""mlx-lm-lora's CPO (mlx_lm_lora/trainer/cpo_trainer.py): chosen and rejected through the
policy, no reference, the logits cast to float32. Its compiled step fails on mlx 0.32.4
(IndexError: _Map_base::at): it runs, is measured and is estimated with compilation off."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Mode


@dataclass(frozen=True)
class CPO(Mode):
    def batch_iterator(self):
        from mlx_lm_lora.trainer.cpo_trainer import iterate_cpo_batches

        return iterate_cpo_batches

    def train(self, *, model, reference, optimizer, dataset, common, run, callback, tokenizer):
        from mlx_lm_lora.trainer.cpo_trainer import CPOTrainingArgs, train_cpo

        train_cpo(model=model, optimizer=optimizer, train_dataset=dataset, val_dataset=None,
                  args=CPOTrainingArgs(**common, beta=run["beta"], seq_step_size=run["seq_step_size"]),
                  training_callback=callback)


MODE = CPO("cpo", order=2, pairs=True, compiled=False, float32_scores=True, counted_on_miniature=True,
           data_kind="chosen/rejected")
