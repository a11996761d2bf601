"""Predicted against measured step time on this machine.

Configurations are drawn at random AFTER the model (mlxfit/estimate/step_time.py and
step_work.py) was written: tiny Llama-shaped models (float32 and bfloat16, the share
--bfloat16) of random width and depth, random batch, length, trained layers, LoRA or
full, with and without --grad-checkpoint; one predicted slower than --max-predicted
seconds is drawn again (the whole run stays within minutes). Each is measured as
probe --measure measures (a child process taking real mlx-lm steps), and the
machine's rates (measure/rate.py: matmul, elementwise, exp, per operation; a GRPO
run's decoding loop besides, measure/decode_rate.py) are measured right before and
right after it, so prediction and measurement share the
machine's state (the prediction uses the geometric mean of the two); the step time
is the fastest of the steps after the first, as each rate is the best of a few
timings (the machine may be shared: the fastest run is the one least held up by
other processes, on both sides; the median step is kept beside it). The ratio
measured / predicted is what is compared, the median over the repeats. Every fifth
configuration is a DPO run and every fifth a GRPO run (mlx-lm-lora's own trainers,
measured as probe --measure --train-mode measures them, mlxfit/measure/preference.py;
predicted by step_time.preference_step_time); the rest are mlx_lm.lora SFT steps.

    PYTHONPATH=. python benchmarks/step_time.py --seed 7 --runs 24 --repeats 2 --out step_time_blind
Writes benchmarks/results/<out>.md (and .json). With --replay RESULT.json (and --modes
grpo) it measures again the configurations a former set drew, of those modes, at the
model as it is now: in-sample, since they were seen.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from mlxfit.estimate import step_time as st
from mlxfit.measure.decode_rate import measured_decode_op
from mlxfit.measure.parent import measure, request_for
from mlxfit.measure.rate import MachineRates, measure_rates
from mlxfit.model.preference import PreferenceRun
from mlxfit.model.resolve import resolve_model
from mlxfit.model.training import TrainingConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


MODES = ("sft", "sft", "sft", "dpo", "grpo")  # configuration i runs MODES[i % 5]


def draw(rng: random.Random, folder: Path, i: int, bfloat16: float = 0.15):
    hidden = rng.choice([64, 128, 256])
    heads = rng.choice([2, 4])
    layers = rng.choice([2, 4, 6])
    dtype = "bfloat16" if rng.random() < bfloat16 else "float32"
    config = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden + rng.choice([0, 64]),
              "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
              "vocab_size": rng.choice([256, 1024, 4096]), "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "torch_dtype": dtype}
    path = folder / f"m{i}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    full = rng.random() < 0.25
    training = TrainingConfig(fine_tune_type="full" if full else "lora", num_layers=rng.choice([-1, 1, 2]),
                              batch_size=rng.choice([1, 2, 4, 8]), max_seq_length=rng.choice([64, 128, 256, 512]),
                              grad_checkpoint=rng.random() < 0.35, rank=rng.choice([4, 8, 16]))
    mode = MODES[i % len(MODES)]
    if mode == "sft":
        return config, path, training, None
    if mode == "dpo":  # chosen and rejected rows, each max_seq_length wide
        training = replace(training, batch_size=rng.choice([1, 2, 4]), max_seq_length=rng.choice([64, 128, 256]))
        return config, path, training, PreferenceRun(mode, training)
    prompt = rng.choice([16, 32, 64])
    training = replace(training, batch_size=rng.choice([1, 2]), max_seq_length=prompt)
    return config, path, training, PreferenceRun(mode, training, group_size=rng.choice([2, 4]),
                                                 max_completion_length=rng.choice([8, 16, 32]), prompt_length=prompt)


def measured_steps(model, training, run, steps: int) -> list[float]:
    """Seconds of each step, taken by mlx-lm's trainer (SFT) or mlx-lm-lora's (a run)."""
    if run is None:
        return list(measure(request_for(model, training, max_steps=steps, min_steps=steps), timeout=300).step_seconds)
    from mlxfit.measure.preference import measure as measure_run

    seconds = []
    measure_run(model, run, training.max_seq_length, run.prompt_length, steps=steps, timeout=600,
                on_event=lambda e: seconds.append(e["seconds"]) if e.get("event") == "step" else None)
    return seconds


def predicted(model, training, run, speed):
    if run is None:
        return st.step_time(model, training, speed)
    return st.preference_step_time(run, model, speed, training.max_seq_length, run.prompt_length)


def rates_for(dtype: str, run) -> MachineRates:
    """This machine's rates measured now (as probe measures them): a GRPO run's with the
    decoding loop's besides (mlxfit/measure/decode_rate.py), asked only for a rollout."""
    rates = measure_rates(dtype)
    if run is not None and run.spec.rollout:
        rates = replace(rates, decode_op=measured_decode_op(dtype, rates))
    return rates


def between(a: MachineRates, b: MachineRates) -> MachineRates:
    """The geometric mean of the rates measured before and after a configuration (the
    mean where one is zero: a decoding loop's cost found none beyond its counted work)."""
    return MachineRates(*(math.sqrt(x * y) if x and y else (x + y) / 2 if x is not None and y is not None else None
                          for x, y in zip(a.to_dict().values(), b.to_dict().values())))


def replayed(path: Path, folder: Path, modes) -> list:
    """The configurations of a former set's rows (of `modes`, all if none), rebuilt."""
    found = []
    for i, row in enumerate(json.loads(path.read_text())["rows"]):
        mode = row.get("mode", "sft")
        if modes and mode not in modes:
            continue
        config = row["config"]
        model_path = folder / f"m{i}"
        model_path.mkdir(exist_ok=True)
        (model_path / "config.json").write_text(json.dumps(config))
        training = TrainingConfig(**row["training"])
        run = None if mode == "sft" else PreferenceRun(mode, training, **(row.get("run") or {}))
        found.append((config, model_path, training, run, row["ratio"]))
    return found


def measured_row(config, path, training, run, repeats: int, steps: int) -> dict:
    model = resolve_model(str(path))
    ratios = []
    for _ in range(repeats):
        before = rates_for(config["torch_dtype"], run)
        seconds = measured_steps(model, training, run, steps)
        rates = between(before, rates_for(config["torch_dtype"], run))
        step = predicted(model, training, run, st.measured_speed(rates))
        steady = seconds[1:] or seconds
        measured = min(steady)
        ratios.append((measured / step.seconds, measured, step.seconds, statistics.median(steady),
                       {k: round(v, 5) for k, v in step.phases.items()}, rates.to_dict()))
    return {"mode": run.mode if run else "sft",
            "run": {k: getattr(run, k) for k in ("group_size", "max_completion_length", "prompt_length")}
            if run and run.spec.rollout else None,
            "median_ratio": statistics.median(r[3] / r[2] for r in ratios),
            "config": config, "training": {k: v for k, v in training.to_dict().items()
                                           if k in ("fine_tune_type", "num_layers", "batch_size", "max_seq_length",
                                                    "grad_checkpoint", "rank")},
            "ratio": statistics.median(r[0] for r in ratios), "repeats": [list(r) for r in ratios]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bfloat16", type=float, default=0.15, help="share of bfloat16 models drawn")
    ap.add_argument("--max-predicted", type=float, default=0.0, help="redraw a configuration predicted slower (s)")
    ap.add_argument("--out", default="step_time")
    ap.add_argument("--replay", type=Path, help="measure again the configurations of this former result (.json)")
    ap.add_argument("--modes", nargs="*", default=[], help="with --replay: only these modes")
    args = ap.parse_args()
    if args.replay:
        return replay(args)
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            while True:
                config, path, training, run = draw(rng, Path(tmp), i, args.bfloat16)
                model = resolve_model(str(path))
                if not args.max_predicted:
                    break
                guess = rates_for(config["torch_dtype"], run)
                if predicted(model, training, run, st.measured_speed(guess)).seconds <= args.max_predicted:
                    break
            row = measured_row(config, path, training, run, args.repeats, args.steps)
            rows.append(row)
            print(f"{i + 1}/{args.runs} ratio {row['ratio']:.2f} ({[round(r[0], 2) for r in row['repeats']]})",
                  flush=True)
            write(args, rows)  # after every configuration: a run cut short still leaves its rows


def replay(args):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        found = replayed(args.replay, Path(tmp), args.modes)
        for i, (config, path, training, run, former) in enumerate(found):
            row = {**measured_row(config, path, training, run, args.repeats, args.steps), "former_ratio": former}
            rows.append(row)
            print(f"{i + 1}/{len(found)} ratio {row['ratio']:.2f} (formerly {former:.2f})", flush=True)
            write(args, rows, f"`PYTHONPATH=. python benchmarks/step_time.py --replay {args.replay.resolve().relative_to(ROOT)} "
                  f"--modes {' '.join(args.modes)} --repeats {args.repeats} --steps {args.steps} --out {args.out}`: "
                  f"IN-SAMPLE, the {len(found)} configurations of that set's rows of those modes measured again with "
                  "the model as it is now (they were seen when it was written); the ratio that set recorded "
                  "(the model before) beside each.")


def write(args, rows, heading: str | None = None):
    ratios = [r["ratio"] for r in rows]
    errors = [abs(r - 1) for r in ratios]
    out = RESULTS / args.out
    out.with_suffix(".json").write_text(json.dumps({"seed": args.seed, "rows": rows}, indent=1) + "\n")
    heading = heading or (
             f"`PYTHONPATH=. python benchmarks/step_time.py --seed {args.seed} --runs {args.runs} --repeats "
             f"{args.repeats} --steps {args.steps} --bfloat16 {args.bfloat16} --max-predicted {args.max_predicted} "
             f"--out {args.out}`: {len(rows)} of {args.runs} configurations "
             "(tiny Llama shapes, float32 and bfloat16, LoRA and full, lengths 64-512, 2-6 blocks, with and without "
             "checkpointing; every fifth a DPO run and every fifth a GRPO run of mlx-lm-lora), each measured as probe "
             "--measure does, beside the machine's rates (each the best of a few timings) measured just before "
             "and after it. Ratio = measured / predicted step time (the fastest step after the first), median over "
             "the repeats; the median step's ratio beside it.")
    former = "former_ratio" in rows[0]
    lines = ["# Step time: predicted against measured on this machine", "", heading, "",
             f"Median ratio {statistics.median(ratios):.2f}; median error {statistics.median(errors):.0%}, "
             f"worst {max(errors):.0%} (ratios {min(ratios):.2f}-{max(ratios):.2f}); "
             f"{sum(e <= 0.5 for e in errors)} of {len(errors)} within 50%. By the median step: median ratio "
             f"{statistics.median(r['median_ratio'] for r in rows):.2f}, ratios "
             f"{min(r['median_ratio'] for r in rows):.2f}-{max(r['median_ratio'] for r in rows):.2f}.", "",
             "| mode | dtype | hidden x blocks | type | layers | batch x length | checkpoint | measured s | predicted s "
             "| ratio | median-step ratio |" + (" former ratio |" if former else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if former else "")]
    for r in rows:
        c, t = r["config"], r["training"]
        measured = statistics.median(x[1] for x in r["repeats"])
        predicted = statistics.median(x[2] for x in r["repeats"])
        rollout = r.get("run")
        length = (f"{rollout['prompt_length']} + {rollout['max_completion_length']}, group {rollout['group_size']}"
                  if rollout else t["max_seq_length"])
        lines.append(f"| {r.get('mode', 'sft')} | {c['torch_dtype']} | {c['hidden_size']} x {c['num_hidden_layers']} | "
                     f"{t['fine_tune_type']} | {t['num_layers']} | {t['batch_size']} x {length} | {t['grad_checkpoint']} "
                     f"| {measured:.4f} | {predicted:.4f} | {r['ratio']:.2f} | {r['median_ratio']:.2f} |"
                     + (f" {r['former_ratio']:.2f} |" if "former_ratio" in r else ""))
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
