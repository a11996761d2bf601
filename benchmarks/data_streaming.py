"""Does `mlxfit.model.dataset.measure` stream? Memory must stay flat however big the file.

Writes a chat-format JSONL of the given size (default 200 MB) to a temporary folder,
measures it, and samples the process's resident memory (RSS) at every progress call.
Flat means: RSS after the whole file minus RSS after the first few MB is about the
per-example length array (4 bytes an example), not a share of the file.

    python benchmarks/data_streaming.py                 # 200 MB, chars-per-token approximation
    python benchmarks/data_streaming.py --mb 50 --tokenizer path/to/model_folder
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlxfit.model.dataset import approximation, load_tokenizer, measure  # noqa: E402

WORDS = "the quick brown fox jumps over a lazy dog while memory fits or it does not".split()
MB = 10**6


def write_file(path: Path, size: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    phrases = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(500)]
    lines = written = 0
    with open(path, "w") as out:
        while written < size:
            turns = [
                {"role": role, "content": " ".join(rng.choice(phrases) for _ in range(rng.randint(1, 12)))}
                for role in ("user", "assistant") * rng.randint(1, 3)
            ]
            line = json.dumps({"messages": turns}) + "\n"
            out.write(line)
            written += len(line)
            lines += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="file size in MB (10^6 bytes)")
    parser.add_argument("--tokenizer", help="a model folder whose tokenizer to use (default: approximation)")
    args = parser.parse_args()

    choice = load_tokenizer(Path(args.tokenizer)) if args.tokenizer else approximation()
    proc = psutil.Process()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        t0 = time.perf_counter()
        lines = write_file(path, args.mb * MB)
        size = path.stat().st_size
        print(f"wrote {size / MB:.0f} MB, {lines} lines in {time.perf_counter() - t0:.1f} s")

        samples = []  # (bytes_done, rss)

        def on_progress(lines_done, bytes_done, total):
            if lines_done % 1000 == 0 or bytes_done == total:
                samples.append((bytes_done, proc.memory_info().rss))

        rss_before = proc.memory_info().rss
        t0 = time.perf_counter()
        stats = measure(path, choice, on_progress=on_progress, batch_size=4, max_seq_length=2048)
        elapsed = time.perf_counter() - t0

    first = next(rss for done, rss in samples if done >= 5 * MB)
    peak = max(rss for _, rss in samples)
    print(f"tokenizer: {stats.tokenizer_source}; format {stats.format}; {stats.examples} examples")
    print(f"measured in {elapsed:.1f} s ({size / MB / elapsed:.1f} MB/s, {stats.examples / elapsed:.0f} lines/s)")
    print(f"RSS before measure: {rss_before / MB:.1f} MB; after the first 5 MB: {first / MB:.1f} MB; peak: {peak / MB:.1f} MB")
    print(f"growth from the first 5 MB to the end: {(peak - first) / MB:.2f} MB "
          f"(length array: {4 * stats.examples / MB:.2f} MB; file: {size / MB:.0f} MB)")
    for frac in (0.25, 0.5, 0.75, 1.0):
        done, rss = next((d, r) for d, r in samples if d >= frac * size)
        print(f"  at {done / MB:6.0f} MB read: RSS {rss / MB:.1f} MB")
    print(f"p50 {stats.p50}  p90 {stats.p90}  p99 {stats.p99}  max {stats.max}  worst batch {stats.worst_batch_tokens}")


if __name__ == "__main__":
    main()
