"""Fit the efficiency at which mlx-lm training runs on Apple chips (a share of the
chip's peak half-precision rate), on the public runs of
benchmarks/evidence/mac_throughput.csv marked `fit`, and report the error of the
tokens per second predicted for the runs marked `heldout` (chosen by source before
fitting). Writes the efficiency and the held-out range into
mlxfit/data/apple_chips.json and the table into benchmarks/results/chip_efficiency.md.

    PYTHONPATH=. python benchmarks/chip_efficiency.py
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

from mlxfit.estimate import step_time as st
from mlxfit.model.resolve import resolve_model
from mlxfit.model.training import TrainingConfig

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "benchmarks" / "evidence" / "mac_throughput.csv"
TABLE = ROOT / "mlxfit" / "data" / "apple_chips.json"
RESULT = ROOT / "benchmarks" / "results" / "chip_efficiency.md"


def run(row):
    spec = row["model"]
    model = resolve_model(str(ROOT / spec) if spec.startswith("benchmarks/") else spec)
    keys = tuple(k for k in row["lora_keys"].split(",") if k) or None
    training = TrainingConfig(batch_size=int(row["batch_size"]), num_layers=int(row["num_layers"]),
                              max_seq_length=max(int(row["width"]), 2), grad_checkpoint=row["grad_checkpoint"] == "yes",
                              quantize=row["method"] == "qlora", lora_keys=keys)
    return model, training


def predicted_tokens_per_second(row, efficiency: float) -> float:
    model, training = run(row)
    chip = st.find_chip(row["chip"])
    speed = st.Speed(chip.peak_operations * efficiency, chip.bandwidth, "", (1, 1), chip=chip.name)
    seconds = st.step_time(model, training, speed, int(row["width"])).seconds
    return int(row["tokens_per_step"]) / seconds


def main():
    rows = list(csv.DictReader(open(EVIDENCE, encoding="utf-8")))
    fit_rows = [r for r in rows if r["split"] == "fit"]
    held = [r for r in rows if r["split"] == "heldout"]
    # Each fit run's efficiency: the share of the peak its measured step reached (compute only).
    effs = []
    for r in fit_rows:
        model, training = run(r)
        chip = st.find_chip(r["chip"])
        unit = st.Speed(1.0, None, "", (1, 1))
        ops = st.step_time(model, training, unit, int(r["width"])).seconds  # operations at 1 op/s
        measured = int(r["tokens_per_step"]) / float(r["tokens_per_sec"])
        effs.append(ops / (chip.peak_operations * measured))
    fitted = math.exp(statistics.fmean(math.log(e) for e in effs))
    lines = ["# Apple chips: the fitted training efficiency and its held-out error", "",
             "Written by `PYTHONPATH=. python benchmarks/chip_efficiency.py` from "
             "`benchmarks/evidence/mac_throughput.csv` (sources and readings in its notes). The runs were split by "
             "source before fitting: `fit` rows set the efficiency (the geometric mean of each run's share of its "
             "chip's peak), `heldout` rows only test it.", "",
             f"Fitted efficiency: **{fitted:.3f}** of the peak half-precision rate "
             f"({len(fit_rows)} runs, {len({r['chip'] for r in fit_rows})} chips).", "",
             "| split | chip | model | batch x width | reported tok/s | predicted tok/s | predicted / reported |",
             "|---|---|---|---|---|---|---|"]
    ratios = {"fit": [], "heldout": []}
    for r in fit_rows + held:
        pred = predicted_tokens_per_second(r, fitted)
        ratio = pred / float(r["tokens_per_sec"])
        ratios[r["split"]].append(ratio)
        lines.append(f"| {r['split']} | {r['chip']} | {Path(r['model']).name} | {r['batch_size']} x {r['width']} | "
                     f"{float(r['tokens_per_sec']):.0f} | {pred:.0f} | {ratio:.2f} |")
    errors = [abs(x - 1) for x in ratios["heldout"]]
    # The range, as a factor on predicted seconds: measured seconds / predicted = predicted tok/s / reported.
    low = min([1.0] + ratios["heldout"])
    high = max([1.0] + ratios["heldout"])
    lines += ["", f"Held out ({len(held)} runs, {len({r['chip'] for r in held})} chips): median error of the predicted "
              f"tokens per second {statistics.median(errors):.0%}, worst {max(errors):.0%}. The range probe gives is "
              f"the spread of these runs' measured over predicted step time: {low:.2f}-{high:.2f} x the estimate.",
              "", "Every row is low or medium trust: the public logs rarely state the width of the batches, so "
              "the tokens a step takes are read from the context, the data set or tokens/sec over it/sec (see the "
              "notes). Read the range as the size of the error, not a bound."]
    RESULT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = json.loads(TABLE.read_text(encoding="utf-8"))
    table["efficiency"] = {
        "fitted": round(fitted, 4),
        "range": [round(low, 3), round(high, 3)],
        "fit_runs": len(fit_rows), "fit_chips": sorted({r["chip"] for r in fit_rows}),
        "heldout_runs": len(held), "heldout_chips": sorted({r["chip"] for r in held}),
        "heldout_median_error": round(statistics.median(errors), 3),
        "heldout_worst_error": round(max(errors), 3),
        "written_by": "benchmarks/chip_efficiency.py from benchmarks/evidence/mac_throughput.csv",
    }
    TABLE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
