"""The Gemma 4 E4B QAT run of the sixth blind set, read again after scoring (not blind).

    python benchmarks/qat_bits.py

The blind reading took mlx-community's gemma-4-E4B-it-qat-4bit as the standard 4-bit
conversion (its files could not be read here). A public lab note that read those files
(rromenskyi/quant-ternary docs/FINDINGS.md, "Gemma 4 QAT in MLX on the q4_0 grid") finds every
MLP linear at 8 bits, the rest affine 4-bit in groups of 64. This prints the run's estimate both
ways, written as load_model's per-layer `quantization` entries, as mlxfit reads them from a
config.json.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import mac_runs as ev  # noqa: E402
import mac_runs_blind as blind  # noqa: E402

MLP = ("gate_proj", "up_proj", "down_proj")


def main() -> None:
    run = next(r for r in blind.RUNS_SIXTH if r.key.startswith("fin-foreman-gemma-4-e4b-it-qat"))
    config = run.model_info().config
    quant = config["quantization"]
    blocks = config["text_config"]["num_hidden_layers"]
    eight = {f"language_model.model.layers.{i}.mlp.{name}": {"group_size": quant["group_size"], "bits": 8}
             for i in range(blocks) for name in MLP}
    print(f"{run.key}: logged {run.peak_gb:.3f} GB")
    for label, r in (("standard 4-bit (the blind reading)", run),
                     ("MLP at 8 bits (the lab note's reading)", replace(run, config={"quantization": {**quant, **eight}}))):
        peak = ev.predicted(r)[1] / 1e9
        print(f"  {label}: {peak:.2f} GB, {peak / run.peak_gb - 1:+.1%}")


if __name__ == "__main__":
    main()
