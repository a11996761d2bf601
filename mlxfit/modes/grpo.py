"""mlx-lm-lora's GRPO (mlx_lm_lora/trainer/grpo_trainer.py): a rollout that generates
group_size completions per prompt (KV caches), then a scoring step of microbatches
against a frozen reference model. Two phases; no miniature (its terms are its own)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .base import Mode


@dataclass(frozen=True)
class GRPO(Mode):
    def own_changes(self, model, run) -> list:
        out = []
        for c in sorted({run.max_completion_length // 2, 128} - {run.max_completion_length}, reverse=True):
            if 0 < c < run.max_completion_length:
                out.append((f"--max-completion-length {c}", "shorter completions: less room to reason",
                            replace(run, max_completion_length=c)))
        if run.group_size > 2:
            out.append((f"--group-size {max(2, run.group_size // 2)}",
                        "fewer completions per prompt: noisier advantages (the scoring runs one microbatch per "
                        "completion group, so this saves little)",
                        replace(run, group_size=max(2, run.group_size // 2))))
        if run.beta != 0:
            out.append(("--beta 0", "no KL penalty: the reference is still loaded but not run", replace(run, beta=0.0)))
        return out + self.reference_changes()

    def batch_iterator(self):
        from mlx_lm_lora.trainer.grpo_trainer import iterate_grpo_batches

        return iterate_grpo_batches

    def batch_width(self, batch) -> int:
        prompts = batch[0]
        return max(len(p) for p in prompts)

    def synthesized(self, rng, vocab: int, n: int, request: dict) -> list:
        P = request["prompt_length"]
        return [(rng.integers(1, vocab, P).tolist(), [1], "p", "a", None) for _ in range(n)]

    def train(self, *, model, reference, optimizer, dataset, common, run, callback, tokenizer):
        from mlx_lm_lora.trainer.grpo_trainer import GRPOTrainingArgs, train_grpo

        train_grpo(model=model, ref_model=reference, tokenizer=tokenizer, optimizer=optimizer,
                   train_dataset=dataset, val_dataset=None,
                   args=GRPOTrainingArgs(**common, beta=run["beta"], group_size=run["group_size"],
                                         max_completion_length=run["max_completion_length"]),
                   training_callback=callback)


MODE = GRPO("grpo", order=4, rollout=True, reference=True, data_kind="prompt/answer")
