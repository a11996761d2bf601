"""benchmarks/mac_unseen.py and its data: every unseen public Mac run is reproduced, as its log reads.

The blind figures themselves are the script's output (benchmarks/results/mac_unseen.md), not
asserted here: these tests pin the reading of each run, which the figures rest on.
"""

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import mac_runs as ev  # noqa: E402
import mac_unseen as mu  # noqa: E402

ROWS = list(csv.DictReader(open(ROOT / "benchmarks" / "evidence" / mu.FILE, encoding="utf-8")))


def test_every_unseen_row_is_reproduced_once_with_its_logged_peak_and_trust():
    assert sorted(run.row for run in mu.RUNS) == list(range(len(ROWS)))
    for run in mu.RUNS:
        row = ROWS[run.row]
        assert (row["key"], row["peak_gb"], row["trust"]) == (run.key, f"{run.peak_gb:g}", run.trust)
        assert run.file == mu.FILE


def test_every_time_row_is_an_unseen_row_with_its_logged_pace():
    by_key = {row["key"]: row for row in ROWS}
    for row in mu.TIME_ROWS:
        logged = by_key[row["key"]]
        assert (logged["tokens_per_sec"], logged["tokens_per_step"], logged["width"]) == (
            row["tokens_per_sec"], row["tokens_per_step"], row["width"])


@pytest.mark.parametrize("key, logged", [
    ("qwen3-8b-8bit-32-layers", 19.399e6),  # 32 blocks, every linear of Qwen3-8B at rank 8
    ("phi3-mini-o-proj-iter10", 3_145_728),  # keys q,k,v,o on Phi-3: o_proj alone, rank 16, 32 blocks
    ("mistral7b-v0.2-uniform-210", 3.408e6),  # --num-layers 16 not honoured: q,v in all 32 blocks
    ("qwen2.5-7b-4bit-ckpt-b4", 11.534e6),
    ("phi4-mini-reasoning-qkv-b4", 1.049e6),  # phi3's keys before mlx-lm 0.28.2: qkv_proj alone
    ("rlt-7b-4bit-smoke", 2.884e6),
])
def test_the_reading_reproduces_the_logged_trainable_parameters(key, logged):
    run = next(r for r in mu.RUNS if r.key == key)
    features, _ = ev.run_features(run)[0]
    assert abs(features["trainable_bytes"] / 4 - logged) <= 0.0005e6 + 1e-9 * logged
