"""The once-blind public Mac runs (benchmarks/evidence/mac_runs_unseen.csv, benchmarks/mac_runs.py
RUNS_UNSEEN): every row is reproduced as its log reads. They were scored blind once (docs/accuracy.md)
and are fitted since; these tests pin the reading of each run, which the figures rest on.
"""

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import mac_runs as ev  # noqa: E402

ROWS = list(csv.DictReader(open(ROOT / "benchmarks" / "evidence" / ev.UNSEEN, encoding="utf-8")))


def test_every_unseen_row_is_reproduced_once_with_its_logged_peak_and_trust():
    assert sorted(run.row for run in ev.RUNS_UNSEEN) == list(range(len(ROWS)))
    for run in ev.RUNS_UNSEEN:
        row = ROWS[run.row]
        assert (row["key"], row["peak_gb"], row["trust"]) == (run.key, f"{run.peak_gb:g}", run.trust)
        assert run.file == ev.UNSEEN


def test_runs_held_at_the_allocator_limit_are_not_fitted():
    fitted = {run.key for run in ev.RUNS}
    assert set(ev.AT_ALLOCATOR_LIMIT) <= {run.key for run in ev.RUNS_UNSEEN}
    assert not fitted & set(ev.AT_ALLOCATOR_LIMIT)
    assert {run.key for run in ev.RUNS_UNSEEN} - set(ev.AT_ALLOCATOR_LIMIT) <= fitted
    for key in ev.AT_ALLOCATOR_LIMIT:  # 0.95 x 128 GiB, as MetalAllocator's block_limit_
        run = next(r for r in ev.RUNS_UNSEEN if r.key == key)
        assert 0.999 * 0.95 * 128 * 2**30 < run.peak_bytes < 0.95 * 128 * 2**30


def test_peaks_logged_before_mlx_lm_printed_gigabytes_are_gibibytes():
    units = {run.key: run.logged_unit for run in ev.RUNS_UNSEEN}
    assert units["llama3-8b-bf16-rank128-iter10"] == 2**30 and units["qwen3-8b-8bit-32-layers"] == 10**9


def test_the_step_is_compiled_only_where_the_mlx_lm_of_its_date_compiled_it():
    assert not ev.compiled_step("2024-07-16") and ev.compiled_step("2024-03-20")
    assert not ev.compiled_step("2025-02-23") and ev.compiled_step("2025-03-25")
    assert not next(r for r in ev.RUNS_UNSEEN if r.key == "mistral7b-v0.2-uniform-210").compiled


@pytest.mark.parametrize("key, logged", [
    ("qwen3-8b-8bit-32-layers", 19.399e6),  # 32 blocks, every linear of Qwen3-8B at rank 8
    ("phi3-mini-o-proj-iter10", 3_145_728),  # keys q,k,v,o on Phi-3: o_proj alone, rank 16, 32 blocks
    ("mistral7b-v0.2-uniform-210", 3.408e6),  # --num-layers 16 not honoured: q,v in all 32 blocks
    ("qwen2.5-7b-4bit-ckpt-b4", 11.534e6),
    ("phi4-mini-reasoning-qkv-b4", 1.049e6),  # phi3's keys before mlx-lm 0.28.2: qkv_proj alone
    ("rlt-7b-4bit-smoke", 2.884e6),
])
def test_the_reading_reproduces_the_logged_trainable_parameters(key, logged):
    run = next(r for r in ev.RUNS_UNSEEN if r.key == key)
    features, _ = ev.run_features(run)[0]
    assert abs(features["trainable_bytes"] / 4 - logged) <= 0.0005e6 + 1e-9 * logged
