"""Does the same run reach the same peak every time? Rows of the accuracy grid, measured again.

    python benchmarks/repeat_peak.py 4020 5002 5025 --times 3     # idle machine
    python benchmarks/repeat_peak.py 5002 --busy 4                # with 4 busy-looping processes

Each row is measured `--times` times with `--measure`'s path (real mlx-lm steps in a child
process, the figure mlx-lm's trainer reports, as benchmarks/accuracy.py measures it), with
`--busy` processes spinning on the CPU meanwhile to change the threads' timing. A peak that
moves between repeats is the scheduler's; one that does not is set by the graph and the
run-ahead window, which counts dispatches, not time (docs/accuracy-notes.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=int, nargs="+", help="rows of benchmarks/accuracy.py's grid or its held-out checks")
    parser.add_argument("--times", type=int, default=3, help="measurements of each row")
    parser.add_argument("--busy", type=int, default=0, help="busy-looping processes while measuring")
    args = parser.parse_args()
    import accuracy
    from mlxfit.measure.parent import measure, request_for

    rows = {s["index"]: s for s in accuracy.every_row()}
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    try:
        for index in args.index:
            peaks = []
            for _ in range(args.times):
                model, training = accuracy.model_and_training(rows[index])
                tic = time.time()
                peaks.append(measure(request_for(model, training), timeout=900).peak_with_load_bytes)
                print(json.dumps({"index": index, "peak_MB": round(peaks[-1] / 1e6, 1), "busy": args.busy,
                                  "seconds": round(time.time() - tic, 1)}), flush=True)
            print(f"#{index}: {len(set(peaks))} distinct peak(s) in {len(peaks)} runs, "
                  f"{min(peaks) / 1e6:.1f}-{max(peaks) / 1e6:.1f} MB", flush=True)
    finally:
        for p in busy:
            p.terminate()


if __name__ == "__main__":
    main()
