"""mlx-lm-lora's DPO (mlx_lm_lora/trainer/dpo_trainer.py): chosen and rejected through the
policy in one step, scored against a frozen reference model, the logits cast to float32."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .base import Mode


@dataclass(frozen=True)
class DPO(Mode):
    def own_changes(self, model, run) -> list:
        return [*self.reference_changes(), ("--train-mode orpo", "ORPO needs no reference model (a different objective)", replace(run, mode="orpo"))]

    def batch_iterator(self):
        from mlx_lm_lora.trainer.dpo_trainer import iterate_dpo_batches

        return iterate_dpo_batches

    def train(self, *, model, reference, optimizer, dataset, common, run, callback, tokenizer):
        from mlx_lm_lora.trainer.dpo_trainer import DPOTrainingArgs, train_dpo

        train_dpo(model=model, ref_model=reference, optimizer=optimizer, train_dataset=dataset, val_dataset=None,
                  args=DPOTrainingArgs(**common, beta=run["beta"], seq_step_size=run["seq_step_size"]),
                  training_callback=callback)


MODE = DPO("dpo", order=1, pairs=True, reference=True, float32_scores=True, counted_on_miniature=True,
           data_kind="chosen/rejected", lazy_head_at_peak=True)
