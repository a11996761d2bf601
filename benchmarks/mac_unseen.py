"""The shipped Mac estimates on public Mac runs that no fit or design choice has seen.

    python benchmarks/mac_unseen.py [--file mac_runs_blind2.csv | ... | mac_runs_blind12.csv]

benchmarks/evidence/mac_runs_blind.csv (the default) and mac_runs_blind2.csv onwards (found later,
each scored with the memory model frozen when it was found: benchmarks/mac_runs_blind.py SETS and
docs/accuracy.md say which) hold public mlx-lm fine-tuning logs from Apple silicon
found while the memory model changed and read into runs (benchmarks/mac_runs_blind.py) without
any estimate; the model (its form, coefficients and ranges) and the Mac time model
(mlxfit/estimate/step_time.py with the efficiency in mlxfit/data/apple_chips.json) were frozen
before they were scored. None of them is in the fitted evidence files. Each run is reproduced
through the same path as the fitted ones: memory with benchmarks/mac_runs.py's reading of a run
(its mlx-lm's keys, padding, layer rule, compile and the unit of its log) and
benchmarks/mac_evidence.py's error and range check, with the shipped Metal coefficients and
ranges; time with benchmarks/chip_efficiency.py's predicted tokens per second and the shipped
efficiency, cost per operation and range. Nothing here is fitted. Writes
benchmarks/results/mac_unseen.md (mac_unseen_blind2.md and so on for the later files). (The
set scored blind before, mac_runs_unseen.csv, is fitted since: docs/accuracy.md keeps its blind figures.)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import chip_efficiency as ce  # noqa: E402
import mac_evidence as me  # noqa: E402
import mac_runs_blind as blind  # noqa: E402
from mlxfit.estimate.detailed import coefficients  # noqa: E402
from mlxfit.estimate.uncertainty import range_factors  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def result_path(file: str) -> Path:
    """mac_unseen.md for the first blind file, mac_unseen_blind2.md for mac_runs_blind2.csv, and so on."""
    if file == blind.FILE:
        return RESULTS / "mac_unseen.md"
    return RESULTS / f"mac_unseen_{Path(file).stem.removeprefix('mac_runs_')}.md"


def memory_rows(runs):
    c, fixed = me.vector(coefficients()["metal"])
    out = []
    for run in runs:
        case = me.Case(run)
        lo, hi = case.predicted(c, fixed)
        low, high = range_factors("metal", kind=run.kind)
        out.append({"run": run, "pred": (lo / 1e9, hi / 1e9), "error": case.error(c, fixed),
                    "inside": case.inside(c, fixed, low, high), "range": (low, high), "exact": run.exact_length})
    return out


def time_rows(rows):
    eff = ce.st.fitted_efficiency()
    fitted, per_op, (band_lo, band_hi) = eff["fitted"], eff["seconds_per_op"], eff["range"]
    out = []
    for row in rows:
        predicted = ce.predicted_tokens_per_second(row, fitted, per_op)
        ratio = predicted / float(row["tokens_per_sec"])
        out.append({"row": row, "pred": predicted, "ratio": ratio, "inside": band_lo <= ratio <= band_hi})
    return out, (fitted, per_op, band_lo, band_hi)


def summary(mem, tim, eff) -> list[str]:
    if not mem:
        return ["Memory: no run of this file can be reproduced (below: why)."] + (
            [] if tim else ["Time: no run with a chip and a logged pace."])
    errors = [abs(m["error"]) for m in mem]
    exact = [m for m in mem if m["exact"]]
    widths = [m["range"][1] - m["range"][0] for m in mem]
    lines = [f"Memory: {len(mem)} runs from {len({m['run'].source for m in mem})} sources; "
             f"{sum(m['inside'] for m in mem)} of {len(mem)} inside the shipped range; "
             f"median |error| {statistics.median(errors):.1%} (from the nearer bound; 0 where the logged peak "
             "lies between the predictions at the bounds of the longest row); "
             + (f"exact-length runs: {len(exact)}, worst under {min(min(m['error'] for m in exact), 0):+.1%}, "
                f"worst {max((m['error'] for m in exact), key=abs):+.1%}; " if exact else "no exact-length run; ")
             + f"median range width {statistics.median(widths):.0%} of the estimate."]
    ratios = [t["ratio"] for t in tim]
    if not ratios:
        return lines + ["Time: no run with a chip and a logged pace."]
    lines.append(f"Time: {len(tim)} runs with a chip and a logged pace; predicted / logged tokens per second "
                 f"{', '.join(f'{x:.2f}' for x in ratios)}; median |error| "
                 f"{statistics.median(abs(x - 1) for x in ratios):.0%}; {sum(t['inside'] for t in tim)} of {len(tim)} "
                 f"inside the time range ({eff[2]:.3f}-{eff[3]:.3f} x the predicted step time).")
    return lines


def report(file, mem, tim, eff) -> str:
    head = summary(mem, tim, eff)
    command = "python benchmarks/mac_unseen.py" + ("" if file == blind.FILE else f" --file {file}")
    lines = ["# The Mac estimates on unseen public runs (blind)", "",
             f"Written by `{command}` from `benchmarks/evidence/{file}`: public "
             "mlx-lm fine-tuning logs from Apple silicon, read into runs (`benchmarks/mac_runs_blind.py`) without an "
             "estimate, then scored with the memory model (form, coefficients, ranges: "
             "`mlxfit/data/coefficients.json`, `ranges.json`) and the Mac time model (`mlxfit/estimate/step_time.py`, "
             "`mlxfit/data/apple_chips.json`) as frozen before the scoring. None of these runs is in the "
             "fitted evidence files (checked by source and by number). Each row of the CSV says what its log states "
             "and what was inferred.", "", *[f"- {x}" for x in head], "",
             "## Memory", "",
             "| run | trust | model | batch | blocks | ckpt | longest row (bounds) | logged GB | predicted GB at the bounds "
             "| error | range | inside |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in mem:
        r, t = m["run"], m["run"].training_config()
        lo, hi = r.lengths()
        lines.append(f"| {r.key} | {r.trust} | {r.model} | {t.batch_size} | {t.num_layers} | "
                     f"{'yes' if t.grad_checkpoint else 'no'} | {lo}-{hi}{' (exact)' if m['exact'] else ''} | "
                     f"{r.peak_bytes / 1e9:.2f}{' ¹' if r.logged_unit != 10**9 else ''} | "
                     f"{m['pred'][0]:.2f}-{m['pred'][1]:.2f} | {me.pct(m['error'])} | "
                     f"{m['range'][0]:.3f}-{m['range'][1]:.3f} | {'yes' if m['inside'] else 'no'} |")
    lines += ["", "Error: (prediction - logged) / logged from the nearer of the two bounded predictions, 0 where the "
              "logged peak lies between them; inside: the logged peak within [low x the prediction at the lower bound, "
              "high x the prediction at the upper bound], the shipped Metal range of the run's kind "
              "(benchmarks/mac_evidence.py `Case`). Logged GB are 10^9 bytes (¹ logged in GiB: mlx-lm before "
              "2024-11-07, benchmarks/mac_runs.py GIB_PEAKS_UNTIL).", "",
              "## Time", "",
              f"Shipped: matrix products at {eff[0]:.3f} of the chip's measured matrix-product rate, {eff[1] * 1e6:g} µs per "
              f"dispatched operation, range {eff[2]:.3f}-{eff[3]:.3f} x the predicted step time "
              "(benchmarks/chip_efficiency.py `predicted_tokens_per_second`).", "",
              "| run | trust | chip | batch x width | tokens a step | logged tok/s | predicted tok/s | predicted / logged "
              "| inside |", "|---|---|---|---|---|---|---|---|---|"]
    for t in tim:
        row = t["row"]
        lines.append(f"| {row['key']} | {row['trust']} | {row['chip']} | {row['batch_size']} x {row['width']} | "
                     f"{row['tokens_per_step']} | {float(row['tokens_per_sec']):.0f} | {t['pred']:.0f} | "
                     f"{t['ratio']:.2f} | {'yes' if t['inside'] else 'no'} |")
    lines += ["", "Width: the mean row of the logged steps, padded (the rows of a batch differ, so the real width is "
              "larger and the predicted pace an upper bound).", "",
              "## Found but not scored", "",
              "Public Mac runs with a logged peak that the existing path cannot reproduce as their logs state:", ""]
    lines += [f"- {what}: {why}." for what, why in blind.SETS[file][2]]
    return "\n".join(lines) + "\n"


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Score a blind file of public Mac runs with the shipped model.")
    ap.add_argument("--file", choices=list(blind.SETS), default=blind.FILE)
    file = ap.parse_args().file
    runs, time, _ = blind.SETS[file]
    mem = memory_rows(runs)
    tim, eff = time_rows(time)
    text = report(file, mem, tim, eff)
    result_path(file).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
