"""benchmarks/mac_runs_blind.py and its data: every blind public Mac run is read once, as its log reads.

Nothing here estimates a peak: the runs are scored once, blind, after the change they check is
frozen. These tests pin the reading of each run (its row, logged peak and trust, the pace rows,
and the trainable weights the log prints against the model's own linears).
"""

import ast
import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import mac_runs_blind as mb  # noqa: E402

EVERY_RUN = [run for runs, _, _ in mb.SETS.values() for run in runs]


def _rows(file):
    return list(csv.DictReader(open(ROOT / "benchmarks" / "evidence" / file, encoding="utf-8")))


@pytest.mark.parametrize("file", mb.SETS)
def test_every_blind_row_is_read_once_with_its_logged_peak_and_trust_or_said_why_not(file):
    runs, _, not_scored = mb.SETS[file]
    table = _rows(file)
    rows = [run.row for run in runs]
    assert len(rows) == len(set(rows))
    for run in runs:
        row = table[run.row]
        assert (row["key"], float(row["peak_gb"]), row["trust"]) == (run.key, run.peak_gb, run.trust)
        decimals = len(row["peak_gb"].partition(".")[2])  # half the precision the peak was printed with
        assert run.rounding_gb == pytest.approx(0.5 * 10.0**-decimals)
        assert run.file == file
    left = [i for i in range(len(table)) if i not in rows]
    assert all(any(table[i]["key"] in what for what, _ in not_scored) for i in left)
    assert len(left) == len(not_scored)


@pytest.mark.parametrize("file", mb.SETS)
def test_every_time_row_is_a_blind_row_with_its_logged_pace(file):
    """The pace as logged; the tokens a step and the width as logged where the row gives them as numbers."""
    by_key = {row["key"]: row for row in _rows(file)}
    for row in mb.SETS[file][1]:
        logged = by_key[row["key"]]
        assert logged["tokens_per_sec"] == row["tokens_per_sec"]
        for field in ("tokens_per_step", "width"):
            assert not logged[field].isdigit() or logged[field] == row[field]


def test_the_module_imports_nothing_that_estimates():
    tree = ast.parse((ROOT / "benchmarks" / "mac_runs_blind.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "sys", "pathlib", "mac_runs"}


def test_each_run_builds_its_settings_and_widths():
    for run in EVERY_RUN:
        t = run.training_config()
        lo, hi = run.lengths()
        assert 1 <= lo <= hi <= t.max_seq_length


def _adapted(run) -> int:
    """Trainable weights of the run as its mlx-lm applied them, counted as mlxfit counts them
    (a count of parameters, not an estimate of the peak)."""
    from mlxfit.estimate.detailed import counted_totals

    return counted_totals(run.model_info(), run.training_config())[1]


@pytest.mark.parametrize("key, logged", [
    ("qwen2.5-0.5b-bf16-lab-rank8", 0.733e6),
    ("qwen2.5-0.5b-bf16-lab-rank4", 0.367e6),
    ("qwen2.5-0.5b-4bit-faq-8-layers", 1.466e6),
    ("qwen2.5-14b-4bit-qv-4-layers-b1", 0.524e6),  # q,v only (mlx-lm before 0.28.2)
    ("phi3-mini-bf16-m4pro-4-layers-rank4", 0.786e6),
    ("phi3.5-mini-bf16-qkv-16-layers-music", 1.573e6),  # qkv_proj only
    ("phi3-mini-bf16-qkv-all-32-layers-music", 3.146e6),  # --num-layers 16 not honoured: all 32 blocks
    ("llama3.2-3b-4bit-m2-b4-16-layers", 6.947e6),
    ("bonsai-1.7b-2bit-emotion-b2-4-layers", 1.245e6),
    ("qwen2.5-1.5b-bf16-m4max-rank16-8-layers-b2", 5.276e6),
    ("qwen2.5-1.5b-bf16-m4max-rank8-8-layers-b2", 2.638e6),
    ("qwen3-1.7b-bf16-maformac-tiny-ablation-4992-ckpt", 17.433e6),  # all 28 blocks at rank 16
    ("qwen2.5-3b-4bit-wechat-qv-16-layers-b4", 0.819e6),  # Qwen2.5-3B's count, not the 7B the post names
    ("llama3.2-3b-bf16-raif-smoke-rank16-b4", 13.9e6),  # printed as '13.9 M'
    ("llama3.2-3b-bf16-raif-warm-rank32-b4", 27.8e6),  # printed as '27.8 M'
    ("gemma-3-4b-text-8bit-m1-12-layers-b1", 5.259e6),  # 12 blocks, every linear
    ("qwen3-8b-base-4bit-dalbitalba-simul-1-layer-b1", 0.606e6),  # rank 8 on one block, not the summary's r=128
    ("qwen2.5-1.5b-4bit-assistente-medico-rank16-b2-8-layers", 5.276e6),
    ("spoke-qwen3-4b-it-2507-bf16-36l-b4-v4-t2v4", 16.5e6),  # the ledger's '16.5M'
    ("spoke-qwen3-4b-it-2507-8bit-36l-b4-v4", 16.5e6),
    ("spoke-qwen3-4b-it-2507-bf16-16l-b4-adamw-nockpt-t6b", 7.3e6),  # '7.3M' for 16 blocks (its Muon run)
    ("spoke-llama-3.2-3b-it-bf16-28l-b4-v4-t2", 12.2e6),
    ("spoke-gemma-3-4b-it-bf16-34l-b4-ckpt-v3", 14.9e6),
    ("spoke-lfm2.5-1.2b-it-bf16-16l-b4-v3", 5.554e6),
    ("spoke-lfm2-2.6b-exp-bf16-30l-b4-v3", 12.2e6),
    ("fraud-sentinel-qwen2.5-1.5b-it-4bit-8l-b4-256-m2-16gb", 2.638e6),
    ("josiefied-qwen2.5-0.5b-it-b1-8l-ga10-goekdeniz-mlxlm326", 0.180e6),  # q,v on 8 blocks
    ("claimtrace-qwen3-1.7b-bf16-16l-r16-b1-ckpt-n135", 9.961e6),  # every linear of 16 blocks at rank 16
    ("claimtrace-qwen3-1.7b-4bit-16l-r16-b1-ckpt-q33", 9.961e6),
    ("fin-foreman-gemma-4-e4b-it-qat-4bit-16l-b1-ckpt-3072-m4-imac", 6.914e6),
    ("taskloop-triage-qwen3-4b-it-2507-4bit-b4-nockpt-leg1-m1pro-16gb", 7.340e6),  # its model-card test's count
    ("ruby-trainer-qwen3-8b-mlx-4bit-16l-b1-2048-run1", 9.699e6),  # its 39 MB float32 adapter: 16 x 606,208
    ("agent-sandbox-i0-gemma-4-e2b-it-4bit-8l-b2-1536-16gb", 3.4e6),  # '3.4M trainable params'
    ("georgia-ev-v3-qwen2.5-14b-it-mlx-8bit-48l-r16-b4-ckpt-1024-m4pro-48gb", 68.813e6),
    ("georgia-ev-v4-qwen2.5-14b-it-mlx-8bit-48l-r24-b4-ckpt-1536-m4pro-48gb", 103.219e6),
    ("jac-ml-studio-cpt-v1-qwen3-coder-30b-a3b-q4-16l-r16-b1-ckpt-4096-m5pro-48gb", 281.838e6),  # experts included
    ("qxen-safe-v11-t031-qwen3.5-9b-4bit-4l-r4-b1-ckpt-512-24gb", 1.352e6),  # 3 gated-delta + 1 attention block
    ("qxen-safe-v1-t020-qwen3.5-9b-4bit-8l-r8-b1-ckpt-1024-24gb-crash", 5.410e6),
    ("jac-ml-studio-sft-gemma-probe-gemma-4-26b-a4b-q4-16l-r16-b2-2048-m5pro-48gb", 356.708e6),
    ("jac-ml-studio-sft-gptoss-probe-gpt-oss-20b-q4-16l-r16-b2-2048-m5pro-48gb", 147.612e6),
    ("jac-ml-studio-sft-qwen25c-probe-qwen2.5-coder-14b-q4-16l-r16-b2-2048-m5pro-48gb", 22.938e6),  # the 14B's
])
def test_the_reading_reproduces_the_logged_trainable_parameters(key, logged):
    run = next(r for r in EVERY_RUN if r.key == key)
    tenths = (key.startswith(("llama3.2-3b-bf16-raif", "spoke-", "agent-sandbox-"))
              and key != "spoke-lfm2.5-1.2b-it-bf16-16l-b4-v3")
    printed = 0.05e6 if tenths else 0.0005e6  # half the printed precision ('13.9 M', '16.5M')
    assert abs(_adapted(run) - logged) <= printed + 1e-9 * logged
