"""How long does `mlxfit probe` (an estimate, nothing measured) take to answer,
against the bare imports it cannot avoid and, side by side, mlx-train-perf's `plan`?

    python benchmarks/startup.py              # 10 runs of each, medians
    python benchmarks/startup.py --repeat 1   # a quick check that it runs
    python benchmarks/startup.py --mlx-train-perf /tmp/mtp/bin/mlx-train-perf

Two cases of one model (Qwen2.5-7B-Instruct, mlx-lm's defaults: batch 4 x 2048
tokens, LoRA rank 8, 16 layers): on 16 GB the run does not fit, so probe also
plans (a few hundred runs sized, comparable catalog models compared); on 128 GB
it fits. mlx-train-perf's `plan` answers the same configuration from the same
config.json with the same budget.

mlx-train-perf pins other mlx / mlx-lm versions than mlxfit, so it lives in a
venv of its own: `python -m venv /tmp/mtp && /tmp/mtp/bin/pip install
"mlx[cpu]==0.32.0" mlx-train-perf` (on Linux).

Each command runs in a fresh process (one warm-up run each, not counted), the
commands interleaved so that all see the same machine. What probe remembers
(mlxfit/model/facts.py) is kept between runs in one cache directory, as on a
user's machine after the first probe of a model; the "first run" rows give each
run an empty cache instead (a catalog model's answers then come from the
package data, mlxfit/data/facts.pickle.xz, and nothing is built). `-X importtime` lists what the CLI imports, slowest
first. Writes startup.json and startup.md under --results (default
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


def run_once(cmd: list[str], env: dict, fresh_cache: bool = False) -> float:
    """Wall seconds of one fresh process. mlx-train-perf's plan exits 1 for a run that
    does not fit (its answer still printed), so only a missing answer fails."""
    if fresh_cache:
        with tempfile.TemporaryDirectory(prefix="mlxfit-startup-cold-") as cold:
            return run_once(cmd, dict(env, MLXFIT_CACHE_DIR=cold))
    tic = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - tic
    if done.returncode != 0 and not (done.returncode == 1 and done.stdout.lstrip().startswith("{")):
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


CASES = {"does not fit": "16GB", "fits": "128GB"}
# probe's budget for these Macs (the total less its reserve), in the GiB mlx-train-perf's --budget-gb takes.
BUDGET_GIB = {"16GB": 12e9 / 2**30, "128GB": 96e9 / 2**30}
BARE_IMPORTS = "import mlx.core, mlx.nn, click, psutil"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10, help="runs of each command (median)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="where to write the JSON and markdown")
    parser.add_argument("--mlx-train-perf", type=Path, help="the mlx-train-perf script of a venv that has it")
    parser.add_argument("--model", default="Qwen/Qwen2.5-7B-Instruct", help="catalog id both tools answer for")
    args = parser.parse_args()

    from mlxfit.estimate.calibration import versions  # light: reads package metadata only

    with tempfile.TemporaryDirectory(prefix="mlxfit-startup-") as tmp:
        # No stored calibration, no network: the same answer every run.
        env = dict(os.environ, MLXFIT_CACHE_DIR=tmp, HF_HUB_OFFLINE="1")
        # pip compiles an installed package's .pyc files; a checkout run with
        # PYTHONDONTWRITEBYTECODE set would compile every module on every run
        # instead, so the warm-up run writes them here as an install would.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        probe = [*mlxfit_command(), "probe", "--model", args.model]
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "bare imports": [sys.executable, "-c", BARE_IMPORTS],
        }
        fresh = set()
        for case, memory in CASES.items():
            commands[f"probe {case}"] = [*probe, "--memory", memory, "--json"]
            commands[f"probe {case}, text"] = [*probe, "--memory", memory]
            commands[f"probe {case}, first run"] = [*probe, "--memory", memory, "--json"]
            fresh.add(f"probe {case}, first run")
        if args.mlx_train_perf:
            from mlxfit.model.resolve import catalog

            config = Path(tmp) / "config.json"
            config.write_text(json.dumps(catalog()[args.model.lower()][1]))
            for case, memory in CASES.items():
                # mlx-lm's defaults: batch 4, 2048 tokens (the model sees 2047), rank 8, 16 layers.
                commands[f"mlx-train-perf plan {case}"] = [
                    str(args.mlx_train_perf), "plan", "--config", str(config), "--batch", "4", "--seq-len", "2047",
                    "--lora-rank", "8", "--budget-gb", f"{BUDGET_GIB[memory]:.3f}", "--json"]
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, cmd in commands.items():
            run_once(cmd, env, name in fresh)  # warm-up: the file cache, .pyc files
        for _ in range(args.repeat):
            for name, cmd in commands.items():
                times[name].append(run_once(cmd, env, name in fresh))
        imports = slowest_imports(["probe", "--model", args.model, "--memory", "16GB", "--json"], env)

    medians = {name: statistics.median(values) for name, values in times.items()}
    base, bare = medians["python -c pass"], medians["bare imports"]
    peer = {case: medians.get(f"mlx-train-perf plan {case}") for case in CASES}
    result = {
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "versions": versions(),
        "model": args.model,
        "repeat": args.repeat,
        "seconds": times,
        "median_s": {name: round(m, 4) for name, m in medians.items()},
        "ratio_to_python": {name: round(m / base, 2) for name, m in medians.items()},
        "ratio_to_bare_imports": {name: round(m / bare, 2) for name, m in medians.items()},
        "ratio_to_mlx_train_perf": {
            name: round(m / peer[case], 2)
            for case in CASES for name, m in medians.items() if name.startswith(f"probe {case}") and peer[case]
        },
        "slowest_imports": imports,
    }
    lines = [
        f"# Start-up time of `mlxfit probe --model {args.model}`",
        "",
        f"{result['platform']}; mlx {result['versions']['mlx']}, mlx-lm {result['versions']['mlx-lm']}. "
        f"Median wall time of {args.repeat} fresh process{'es' if args.repeat != 1 else ''} each (after one warm-up), "
        "the commands interleaved. `bare imports`: `python -c \"" + BARE_IMPORTS + "\"`. "
        "On 16 GB the run does not fit (probe plans); on 128 GB it fits. "
        "A \"first run\" has an empty cache (nothing remembered on this machine yet; "
        "a catalog model's answers ship with mlxfit).",
        "",
        "| command | median | × python -c pass | × bare imports | × mlx-train-perf plan |",
        "|---|---|---|---|---|",
    ]
    for name in commands:
        peer_ratio = result["ratio_to_mlx_train_perf"].get(name)
        lines.append(f"| `{name}` | {medians[name] * 1000:.0f} ms | {result['ratio_to_python'][name]:.1f}x | "
                     f"{result['ratio_to_bare_imports'][name]:.2f}x | "
                     f"{f'{peer_ratio:.2f}x' if peer_ratio else ''} |")
    if not args.mlx_train_perf:
        lines += ["", "mlx-train-perf was not given (--mlx-train-perf): no side-by-side ratio."]
    lines += ["", "Slowest top-level imports of `mlxfit probe` on 16 GB (`-X importtime`, cumulative):", ""]
    lines += [f"- `{r['module']}` {r['cumulative_ms']:.0f} ms" for r in imports]
    text = "\n".join(lines) + "\n"
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "startup.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.results / "startup.md").write_text(text)
    print(text, end="")
    print(f"written to {args.results / 'startup.json'} and .md")


if __name__ == "__main__":
    main()
