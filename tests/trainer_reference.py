"""Train with mlx-lm's own trainer and print the peak memory it reports.

Run as a script (a fresh process, like the measurement): reads a measurement
request (JSON) on stdin, builds the same model mlxfit builds, calls
`mlx_lm.tuner.trainer.train` with a TrainingCallback, and prints the list of
`peak_memory` values (GB = 10^9 bytes) it reported, one per step.
"""

import json
import sys
import tempfile
from pathlib import Path

from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback, train

from mlxfit.measure.build import build
from mlxfit.measure.steps import evaluated_synchronously, full_length_dataset, make_optimizer
from mlxfit.model.training import TrainingConfig


class Recorder(TrainingCallback):
    def __init__(self):
        self.peaks = []

    def on_train_loss_report(self, info):
        self.peaks.append(info["peak_memory"])


def main():
    request = json.loads(sys.stdin.read())
    training = TrainingConfig(**request["training"])
    folder = Path(request["folder"]) if request.get("folder") else None
    # Synchronously as the measuring child does when asked: the same deterministic peak.
    with evaluated_synchronously(bool(request.get("synchronous"))), tempfile.TemporaryDirectory() as tmp:
        model = build(request["config"], folder, training)
        recorder = Recorder()
        args = TrainingArgs(
            batch_size=training.batch_size,
            iters=request["max_steps"],
            steps_per_report=1,
            steps_per_eval=10**9,
            steps_per_save=10**9,
            max_seq_length=training.max_seq_length,
            adapter_file=str(Path(tmp) / "adapters.safetensors"),
            grad_checkpoint=training.grad_checkpoint,
            grad_accumulation_steps=training.grad_accumulation_steps,
        )
        dataset = full_length_dataset(training.batch_size, request["length"], request["vocab_size"])
        train(model, make_optimizer(training.optimizer), dataset, None, args=args, training_callback=recorder)
    print("PEAKS " + json.dumps(recorder.peaks))


if __name__ == "__main__":
    main()
