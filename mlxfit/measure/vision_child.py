"""The measuring process for vision-language models: a few real steps of mlx-vlm's
own trainer (mlx_vlm/train.py parse_args and run: load, prepare_model_for_training,
Trainer, common/engine.py train), on random weights.

The request names a model folder holding config.json, the tokenizer and the
processor's files (no weights), a dataset folder in mlx-vlm's JSONL format with its
images, and mlx_vlm.train's flags. The child draws random weights from mlx-vlm's own
model class into a folder of its own (beside the others' files, linked), then runs
mlx_vlm.train as its command line would, with a callback that reads MLX's peak
after every step (steps_per_report 1) and resets it. What differs from a
`python -m mlx_vlm.train` run: nothing but the weights' values and that callback.

More than one step: LoRA adapters and the optimizer's state are created on the first
step and the cached rows fill up as batches are drawn, so the peak is the largest
of the steps', each reported.

Protocol as mlxfit/measure/child.py: a JSON request on stdin, one JSON event per
line on stdout.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from .child import emit, serve

WEIGHTS = "model.safetensors"


def random_weights_folder(source: Path, target: Path, language_blocks: int | None = None) -> Path:
    """`source`'s files linked into `target`, plus random weights drawn from the
    model class mlx_vlm.utils.load_model builds for its config.json; with
    `language_blocks`, config.json's language model is cut to that many blocks (a slice)."""
    import json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args, load_config, update_module_configs

    target.mkdir(parents=True, exist_ok=True)
    for item in Path(source).iterdir():
        cut = language_blocks is not None and item.name == "config.json"
        if item.name != WEIGHTS and not item.name.endswith(".safetensors") and item.is_file() and not cut:
            (target / item.name).symlink_to(item.resolve())
    if language_blocks is not None:
        from ..model.vision import with_language_blocks

        config = json.loads((Path(source) / "config.json").read_text())
        (target / "config.json").write_text(json.dumps(with_language_blocks(config, language_blocks)))
    config = load_config(target)
    model_class, _ = get_model_and_args(config=config)
    config.setdefault("text_config", config.pop("llm_config", {}))
    config.setdefault("vision_config", {})
    config.setdefault("audio_config", {})
    model_config = model_class.ModelConfig.from_dict(config)
    model_config = update_module_configs(model_config, model_class, config,
                                         ["text", "vision", "perceiver", "projector", "audio"])
    model = model_class.Model(model_config)
    mx.save_safetensors(str(target / WEIGHTS), dict(tree_flatten(model.parameters())))
    del model
    mx.clear_cache()
    return target


def measure_steps(request: dict, emit_event=emit) -> dict:
    emit_event("stage", stage="importing mlx-vlm")
    import mlx.core as mx
    from mlx_vlm import train as vlm_train
    from mlx_vlm.trainer.common.callbacks import TrainingCallback

    workdir = Path(os.getcwd())
    emit_event("stage", stage="drawing random weights")
    model = random_weights_folder(Path(request["model"]), workdir / "model", request.get("language_blocks"))
    mx.clear_cache()
    argv = ["--model", str(model), "--data", str(request["data"]), "--iters", str(request["steps"]),
            "--steps-per-report", "1", "--steps-per-save", str(10 ** 9),
            "--output-path", str(workdir / "adapters"), *request.get("flags", [])]
    args, settings = vlm_train.parse_args(argv)
    held = mx.get_active_memory()
    mx.reset_peak_memory()
    peaks, reports = [], []
    since = [time.perf_counter()]

    class Callback(TrainingCallback):
        def on_train_loss_report(self, info):
            peak = mx.get_peak_memory() - held
            peaks.append(peak)
            sequences = max(int(info.get("train_num_sequences", 1)), 1)
            width = (int(info.get("train_num_processed_tokens", 0)) + int(info.get("train_num_padded_tokens", 0))) // sequences
            reports.append({"tokens": width, "vision_tokens": int(info.get("train_num_vision_tokens", 0)),
                            "peak_memory_gb": info.get("peak_memory")})
            emit_event("step", step=info.get("iteration", len(peaks)), peak_bytes=peak,
                       seconds=time.perf_counter() - since[0], tokens=width * sequences)
            mx.reset_peak_memory()
            since[0] = time.perf_counter()

        def on_val_loss_report(self, info):
            pass

    emit_event("stage", stage="mlx-vlm steps")
    tic = since[0] = time.perf_counter()
    vlm_train.run(args, settings, training_callback=Callback())
    return {
        "peak_bytes": max(peaks) if peaks else mx.get_peak_memory() - held,
        "step_peaks_bytes": peaks,
        "steps": len(peaks),
        "seconds": time.perf_counter() - tic,
        # The model's input per example: the padded batch width less the dropped last token.
        "widths": [r["tokens"] for r in reports],
        "vision_tokens": [r["vision_tokens"] for r in reports],
    }


def run(request: dict) -> None:
    try:
        emit("done", measured=measure_steps(request))
    except Exception as e:  # noqa: BLE001 - every failure becomes a report
        emit("error", kind="crash", message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))


def main() -> None:
    from ..model.transformers_notices import quiet_transformers

    quiet_transformers()
    serve(run)


if __name__ == "__main__":
    main()
