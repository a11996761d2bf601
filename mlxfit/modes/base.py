"""What a training mode is to mlxfit: one small protocol that every mode module fills.

A mode says which trainer runs it, what its step holds beside an SFT step (its
phases), what it offers to lower its peak (its own changes, before the ones every
run has), the evidence range of its estimate, how the measuring child trains it and
reads its data, and which of mlxfit's flags and checks apply to it."""

from __future__ import annotations

from dataclasses import dataclass

MLX_LM = "mlx_lm"  # mlx_lm.lora: SFT, estimated by method, measured whole or by slice
MLX_LM_LORA = "mlx_lm_lora"  # mlx_lm_lora.train: one run, estimated phase by phase
MLX_VLM = "mlx_vlm"  # mlx_vlm.train: a vision-language model's run, chosen by the model, not by --train-mode
COMMANDS = {MLX_LM: "mlx_lm.lora", MLX_LM_LORA: "mlx_lm_lora.train", MLX_VLM: "mlx_vlm.train"}


@dataclass(frozen=True)
class Mode:
    name: str  # as --train-mode (and mlx_lm_lora.train's train_mode) spells it
    order: int  # where --train-mode lists it
    trainer: str = MLX_LM_LORA  # the package whose trainer runs it
    pairs: bool = False  # chosen and rejected sequences through the policy in one step
    rollout: bool = False  # generates completions, then scores them
    reference: bool = False  # holds a frozen reference model (train.py load_reference_model)
    compiled: bool = True  # its step runs under mx.compile
    float32_scores: bool = False  # its scores cast the logits to float32 before the cross-entropy
    counted_on_miniature: bool = False  # its logits buffers are counted on a miniature of the model
    data_kind: str | None = None  # what its --data rows hold
    step_is_mlx_lm: bool = False  # its step is mlx-lm's SFT step (sized as one), run by another trainer
    chosen_by_model: bool = False  # taken when the model has a vision part; never listed by --train-mode
    # With --load-in-Nbits, an untied head's full-precision weight is still alive at its first
    # step's peak (measured: estimate/preference.py lazy_head_bytes).
    lazy_head_at_peak: bool = False

    @property
    def trainer_mode(self) -> str:
        """Its name to its trainer (mlx_lm_lora.train's --train-mode)."""
        return self.name

    @property
    def command(self) -> str:
        return COMMANDS[self.trainer]

    @property
    def by_mlx_lm(self) -> bool:
        """mlx_lm.lora's run: estimated by method (LoRA, QLoRA, full), per mlx.launch node,
        measured whole or by slice, --data read by mlx-lm (malformed lines skippable)."""
        return self.trainer == MLX_LM

    # -- its flags and checks ------------------------------------------------------------
    def refusal(self, *, hostfile=None, by_slice=False, skip_bad_lines=False) -> str | None:
        """What this mode's trainer cannot do of what was asked, in one line (None: all of it)."""
        if self.by_mlx_lm:
            return None
        if hostfile:
            return (f"--hostfile with --train-mode {self.name}: mlxfit plans mlx-lm-lora runs for one machine, not "
                    "per mlx.launch node; leave --hostfile out and give --memory of the smallest node")
        if by_slice:
            return (f"--slice with --train-mode {self.name}: mlx-lm-lora's trainers cannot be measured by slice; "
                    "leave --slice out to measure the whole run")
        if skip_bad_lines:
            return (f"--skip-bad-lines with --train-mode {self.name}: mlx-lm-lora reads every row of --data; "
                    "remove the malformed lines")
        return None

    # -- its phases: estimate/preference.py estimate_run reads them from the flags above
    # (pairs, rollout, reference, float32_scores, step_is_mlx_lm); a mode with its own step
    # (modes/vlm.py) defines `estimate`. Kept out of this base so that no import circles back.

    # -- its candidate changes -----------------------------------------------------------
    def own_changes(self, model, run) -> list:
        """(flags, cost, changed run) that only this mode offers, tried before the ones
        every mlx-lm-lora run has (mlxfit/estimate/preference.py _variants)."""
        return self.reference_changes()

    def reference_changes(self) -> list:
        """A 4-bit reference model ("ref4": the reference, not the run, changes), where there is one."""
        if not self.reference:
            return []
        return [("--reference-model-path <a 4-bit conversion of the model>",
                 "the reference scores with quantized weights (mlx_lm.convert -q), not a second full copy", "ref4")]

    # -- its evidence range --------------------------------------------------------------
    def evidence_range(self, peak_bytes: int, backend: str, counted: bool = False, kind: str | None = None):
        """The peak's range on this mode's evidence (data/preference_ranges.json)."""
        from ..estimate.uncertainty import preference_range

        return preference_range(peak_bytes, self.name, backend, counted=counted)

    # -- its measuring child -------------------------------------------------------------
    def batch_iterator(self):
        """mlx-lm-lora's batch iterator for this mode's dataset (yields batches)."""
        raise NotImplementedError(self.name)

    def batch_width(self, batch) -> int:
        """Tokens of one batch as `batch_iterator` yields it, as the estimate reads its length."""
        return batch[0].shape[1]

    def synthesized(self, rng, vocab: int, n: int, request: dict) -> list:
        """`n` random rows of this mode's dataset, as mlx-lm-lora's dataset classes return them."""
        L = request["length"]
        return [
            {"chosen": rng.integers(1, vocab, L).tolist(), "rejected": rng.integers(1, vocab, L).tolist(),
             "chosen_prompt_length": 1, "rejected_prompt_length": 1, "preference_score": 1.0}
            for _ in range(n)
        ]

    def train(self, *, model, reference, optimizer, dataset, common: dict, run: dict, callback, tokenizer):
        """A few steps of mlx-lm-lora's trainer for this mode (the measuring child)."""
        raise NotImplementedError(self.name)
