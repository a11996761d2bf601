"""The measuring process for mlx-lm-lora's SFT, DPO, CPO, ORPO and GRPO: a few real
steps of its own trainer (train_sft, train_dpo, train_cpo, train_orpo, train_grpo).

Random weights as for SFT (mlxfit/measure/build.py), a frozen random reference
for DPO and GRPO (a second full copy, as mlx_lm_lora/train.py load_reference_model
loads one), synthesized batches of the planned width. What differs from a
`mlx_lm_lora.train` run, and why:
- MLX's CPU backend has no "max_recommended_working_set_size" in mx.device_info(),
  which every trainer but GRPO reads unguarded for mx.set_wired_limit (a no-op on
  the CPU): the key is supplied there.
- CPO's compiled step fails on mlx 0.32.4 (IndexError: _Map_base::at): CPO runs
  with compilation off (mx.disable_compile), and the result says so.
- GRPO's tokenizer is a local stand-in with no stop tokens, so every completion
  runs to --max-completion-length (the worst case); the lengths reached are
  reported from the trainer's own metrics.
- As mlx_lm_lora/train.py train_model() does, MLX's and NumPy's generators are
  seeded (CONFIG_DEFAULTS["seed"]) after the models are loaded, before training:
  unseeded, the first step's peak differed from the trainer's by -5% to +11%.
- mlx-lm-lora's full fine-tuning trains every parameter (from_pretrained freezes
  nothing without a LoRA config), so does this one; on a base quantized at load,
  every parameter nn.quantize leaves unfrozen (the norms and biases).
- The quantized base is evaluated before the first step, so the full-precision
  weights that mlx-lm-lora quantizes lazily are not seen (the estimate counts them).

Protocol as mlxfit/measure/child.py: a JSON request on stdin, one JSON event per
line on stdout.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback

from ..modes import get_mode
from .child import emit, serve


class StandInTokenizer:
    """What generate_grpo reads of a tokenizer: no stop tokens, nothing to decode."""

    eos_token_ids: list = []

    def encode(self, text, add_special_tokens=True):
        return []

    def decode(self, ids):
        return ""


def supply_working_set_size() -> None:
    import mlx.core as mx

    info = mx.device_info
    if "max_recommended_working_set_size" in info():
        return

    def device_info():
        found = dict(info())
        found["max_recommended_working_set_size"] = found.get("memory_size", 0)
        return found

    mx.device_info = device_info


def seed_as_train_model() -> None:
    import mlx.core as mx
    import numpy as np

    from ..model.preference import CONFIG_DEFAULTS

    np.random.seed(CONFIG_DEFAULTS["seed"])  # run()
    mx.random.seed(CONFIG_DEFAULTS["seed"])  # train_model()


def build_models(request: dict, training, emit_event=emit):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from .build import build, materialize, random_model

    folder = None
    if training.fine_tune_type == "full":
        # mlx_lm_lora/utils.py from_pretrained: no freeze without a LoRA config.
        model = random_model(request["config"])
        materialize(model)
        model.unfreeze()
        if training.quantize:  # --load-in-Nbits: nn.quantize freezes what it quantizes
            import mlx.nn as nn

            nn.quantize(model, bits=training.bits, group_size=training.group_size)
    else:
        model = build(request["config"], folder, training, on_stage=lambda s: emit_event("stage", stage=s))
    reference = None
    if request["reference"]:
        reference = random_model(request["config"])
        materialize(reference)
        reference.freeze()
    mx.eval([p for _, p in tree_flatten(model.parameters())])
    return model, reference


def synthesized(request: dict, run: dict, batch_size: int):
    import numpy as np

    rng = np.random.default_rng(0)
    V, n = request["vocab_size"], max(batch_size, 1)
    return get_mode(run["mode"]).synthesized(rng, V, n, request)


def measure_steps(request: dict, emit_event=emit) -> dict:
    """A few steps of the request's mode with mlx-lm-lora's trainer; what was measured."""
    from ..model.training import TrainingConfig

    training = TrainingConfig(**request["training"])
    run_ = request["run"]
    mode = run_["mode"]
    spec = get_mode(mode)
    emit_event("stage", stage="importing mlx-lm-lora")
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm.tuner.callbacks import TrainingCallback

    supply_working_set_size()
    if not spec.compiled:
        mx.disable_compile()
    mx.reset_peak_memory()
    held = mx.get_active_memory()
    tic = time.perf_counter()
    model, reference = build_models(request, training, emit_event)
    load_peak = mx.get_peak_memory() - held
    emit_event("built", peak_bytes=load_peak, seconds=time.perf_counter() - tic)
    dataset = synthesized(request, run_, training.batch_size)
    seed_as_train_model()
    opt = {"adam": optim.Adam, "adamw": optim.AdamW, "muon": optim.Muon}[training.optimizer](learning_rate=1e-5)
    peaks, reports = [], []
    since = [time.perf_counter()]  # the last report (one per step): each step's time is the time between two

    class Callback(TrainingCallback):
        def on_train_loss_report(self, info):
            peak = mx.get_peak_memory() - held
            seconds = time.perf_counter() - since[0]
            peaks.append(peak)
            reports.append({k: v for k, v in info.items() if "generated_tokens" in k or k == "peak_memory"})
            emit_event("step", step=info.get("iteration", len(peaks)), peak_bytes=peak, seconds=seconds, tokens=0)
            mx.reset_peak_memory()
            since[0] = time.perf_counter()

        def on_val_loss_report(self, info):
            pass

    steps = request["steps"]
    # The trainer saves its adapters at the end: into the parent's temporary
    # folder (this process's working directory), removed however the parent ends.
    workdir = tempfile.mkdtemp(prefix="mlxfit-rl-", dir=os.getcwd())
    common = dict(
        batch_size=training.batch_size, iters=steps, val_batches=0, steps_per_report=1,
        steps_per_eval=10 ** 9, steps_per_save=10 ** 9, adapter_file=os.path.join(workdir, "adapters.safetensors"),
        max_seq_length=training.max_seq_length, grad_checkpoint=training.grad_checkpoint,
        gradient_accumulation_steps=training.grad_accumulation_steps,
    )
    seq_step = 512 if run_["efficient_long_context"] else None
    mx.reset_peak_memory()
    emit_event("stage", stage=f"{mode} steps")
    tic = since[0] = time.perf_counter()
    spec.train(model=model, reference=reference, optimizer=opt, dataset=dataset, common=common,
               run={**run_, "seq_step_size": seq_step}, callback=Callback(), tokenizer=StandInTokenizer())
    seconds = time.perf_counter() - tic
    lengths = [r.get("train_max_generated_tokens") for r in reports if "train_max_generated_tokens" in r]
    return {
        "peak_bytes": max(peaks) if peaks else mx.get_peak_memory() - held,
        "step_peaks_bytes": peaks,
        "load_peak_bytes": load_peak,
        "steps": len(peaks),
        "seconds": seconds,
        "compiled": spec.compiled,
        "completion_lengths": [float(x) for x in lengths],
        "trainer_peaks_gb": [r.get("peak_memory") for r in reports],
    }


def run(request: dict) -> None:
    try:
        if "miniatures" in request:
            emit("done", measured=measure_miniatures(request["miniatures"]))
        else:
            emit("done", measured=measure_steps(request))
    except Exception as e:  # noqa: BLE001 - every failure becomes a report
        emit("error", kind="crash", message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))


def measure_miniatures(requests: list) -> list:
    """Each request's peak in turn, in this one process (mlxfit/measure/miniature.py):
    the models of one are freed before the next is built."""
    import gc

    import mlx.core as mx

    peaks = []
    for i, request in enumerate(requests):
        emit("stage", stage=f"counting logits buffers on miniatures of the model ({i + 1} of {len(requests)})")
        if get_mode(request["run"]["mode"]).compiled:
            mx.enable_compile()  # a CPO miniature before this one disabled it
        try:
            peaks.append(measure_steps(request, emit_event=lambda *a, **k: None)["peak_bytes"])
        except Exception as e:  # noqa: BLE001 - that shape keeps the fitted count; the others go on
            peaks.append(None)
            emit("miniature_failed", index=i, message=f"{type(e).__name__}: {e}")
        emit("miniature", index=i, peak_bytes=peaks[-1])
        gc.collect()
        mx.clear_cache()
    return peaks


def main() -> None:
    from ..model.transformers_notices import quiet_transformers

    quiet_transformers()  # mlx-lm-lora imports transformers: a failure's last line is then its own
    serve(run)


if __name__ == "__main__":
    main()
