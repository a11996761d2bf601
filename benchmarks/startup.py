"""How long does `mlxfit probe --json` (an estimate, nothing measured) take to start
and answer, against `python -c pass` and, side by side, mlx-train-perf's `plan`?

    python benchmarks/startup.py              # 10 runs of each, medians
    python benchmarks/startup.py --repeat 1   # a quick check that it runs
    python benchmarks/startup.py --mlx-train-perf /tmp/mtp/bin/mlx-train-perf

mlx-train-perf pins other mlx / mlx-lm versions than mlxfit, so it lives in a
venv of its own: `python -m venv /tmp/mtp && /tmp/mtp/bin/pip install
"mlx[cpu]==0.32.0" mlx-train-perf` (on Linux). Its `plan` answers one
configuration from a config.json; mlxfit's probe answers three methods and,
when the run does not fit, searches the remedies too.

Each command runs in a fresh process (one warm-up run each, not counted), the
commands interleaved so that both see the same machine. The estimate path must
not import mlx-lm or transformers; `-X importtime` lists what the CLI does import,
slowest first. Writes startup.json and startup.md under --results (default
benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def mlxfit_command() -> list[str]:
    """The installed `mlxfit` script beside this Python, else `python -m mlxfit`."""
    script = Path(sys.executable).parent / "mlxfit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mlxfit"]


def run_once(cmd: list[str], env: dict) -> float:
    tic = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - tic
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def slowest_imports(cmd_args: list[str], env: dict, top: int = 8) -> list[dict]:
    """`python -X importtime`: the modules with the largest cumulative import time."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlxfit", *cmd_args],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    rows = []
    for line in done.stderr.splitlines():
        fields = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(fields) != 3 or not fields[1].strip().isdigit():
            continue
        name = fields[2].rstrip()
        if len(name) - len(name.lstrip()) == 1:  # one space: imported at the top level, not nested
            rows.append({"module": name.strip(), "cumulative_ms": int(fields[1]) / 1000})
    return sorted(rows, key=lambda r: -r["cumulative_ms"])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs of each command (median)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="where to write the JSON and markdown")
    parser.add_argument("--mlx-train-perf", type=Path, help="the mlx-train-perf script of a venv that has it")
    parser.add_argument("--model", default="Qwen/Qwen3-0.6B", help="catalog id both tools answer for")
    args = parser.parse_args()

    from mlxfit.estimate.calibration import versions  # light: reads package metadata only

    with tempfile.TemporaryDirectory(prefix="mlxfit-startup-") as tmp:
        # No stored calibration, no network: the same answer every run.
        env = dict(os.environ, MLXFIT_CACHE_DIR=tmp, HF_HUB_OFFLINE="1")
        # pip compiles an installed package's .pyc files; a checkout run with
        # PYTHONDONTWRITEBYTECODE set would compile every module on every run
        # instead, so the warm-up run writes them here as an install would.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "mlxfit --version": [*mlxfit_command(), "--version"],
            "mlxfit probe --json": [*mlxfit_command(), "probe", "--json"],
            f"mlxfit probe --model {args.model} --json": [*mlxfit_command(), "probe", "--model", args.model, "--json"],
            # A budget the run fits: no remedies to search, one answer as plan gives.
            f"mlxfit probe --model {args.model} --memory 96GB --json": [
                *mlxfit_command(), "probe", "--model", args.model, "--memory", "96GB", "--json"],
        }
        if args.mlx_train_perf:
            from mlxfit.model.resolve import catalog

            config = Path(tmp) / "config.json"
            config.write_text(json.dumps(catalog()[args.model.lower()][1]))
            # mlx-lm's defaults: batch 4, 2048 tokens (the model sees 2047), rank 8, 16 layers.
            commands["mlx-train-perf plan"] = [str(args.mlx_train_perf), "plan", "--config", str(config), "--batch", "4",
                                               "--seq-len", "2047", "--lora-rank", "8", "--budget-gb", "20", "--json"]
        times: dict[str, list[float]] = {name: [] for name in commands}
        for cmd in commands.values():
            run_once(cmd, env)  # warm-up: the file cache, .pyc files
        for _ in range(args.repeat):
            for name, cmd in commands.items():
                times[name].append(run_once(cmd, env))
        imports = slowest_imports(["probe", "--json"], env)

    medians = {name: statistics.median(values) for name, values in times.items()}
    base = medians["python -c pass"]
    result = {
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "versions": versions(),
        "repeat": args.repeat,
        "seconds": times,
        "median_s": {name: round(m, 4) for name, m in medians.items()},
        "ratio_to_python": {name: round(m / base, 2) for name, m in medians.items()},
        "probe_ratio": round(medians["mlxfit probe --json"] / base, 2),
        "probe_to_mlx_train_perf": (
            round(medians[f"mlxfit probe --model {args.model} --json"] / medians["mlx-train-perf plan"], 2)
            if "mlx-train-perf plan" in medians else None
        ),
        "fitting_probe_to_mlx_train_perf": (
            round(medians[f"mlxfit probe --model {args.model} --memory 96GB --json"] / medians["mlx-train-perf plan"], 2)
            if "mlx-train-perf plan" in medians else None
        ),
        "slowest_imports": imports,
    }
    lines = [
        "# Start-up time of `mlxfit probe --json`",
        "",
        f"{result['platform']}; mlx {result['versions']['mlx']}, mlx-lm {result['versions']['mlx-lm']}. "
        f"Median wall time of {args.repeat} fresh process{'es' if args.repeat != 1 else ''} each (after one warm-up).",
        "",
        "| command | median | ratio to `python -c pass` |",
        "|---|---|---|",
    ]
    for name in commands:
        lines.append(f"| `{name}` | {medians[name] * 1000:.0f} ms | {result['ratio_to_python'][name]:.1f}x |")
    if result["probe_to_mlx_train_perf"] is not None:
        lines += ["", f"`mlxfit probe --model {args.model} --json` takes {result['probe_to_mlx_train_perf']:.2f}x the wall of "
                  "`mlx-train-perf plan` for the same model, measured side by side (on this machine the run does not "
                  f"fit, so probe also searches the remedies); with a budget it fits, "
                  f"{result['fitting_probe_to_mlx_train_perf']:.2f}x."]
    lines += ["", "Slowest top-level imports of `mlxfit probe --json` (`-X importtime`, cumulative):", ""]
    lines += [f"- `{r['module']}` {r['cumulative_ms']:.0f} ms" for r in imports]
    text = "\n".join(lines) + "\n"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results / "startup.md").write_text(text)
    print(text, end="")
    print(f"written to {args.results / 'startup.json'} and .md")


if __name__ == "__main__":
    main()
