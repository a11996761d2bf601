"""The Metal and CUDA terms, the public Mac runs they were checked on, ranges and verdicts.

The mechanisms behind the Metal terms (docs/estimate.md) are pinned here where the CPU
backend can show them: the unfused attention keeps one probability tensor per block,
checkpointing drops it, the unfused cross-entropy holds 2 x the logits beyond them. The
runs themselves are other people's Macs: benchmarks/mac_evidence.py fits and reports them.
"""

import csv
import inspect
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.detailed import estimate
from mlxfit.estimate.uncertainty import predicted_range, ranges
from mlxfit.estimate.verdict import Verdict, judge
from mlxfit.model.resolve import from_catalog
from mlxfit.model.training import TrainingConfig
from mlxfit.runtime import Runtime

EVIDENCE = Path(__file__).resolve().parent.parent / "benchmarks" / "evidence"
sys.path.insert(0, str(EVIDENCE.parent))

import mac_runs as ev  # noqa: E402  (benchmarks/mac_runs.py: the public Mac runs, reproduced)
from conftest import graph_peak  # noqa: E402


def _rows(name):
    return list(csv.DictReader(open(EVIDENCE / name)))


# -- mechanisms, on the CPU backend -------------------------------------------------------

def _attention_grad(blocks: int, checkpoint: bool, d: int):
    import mlx.core as mx

    def block(x):
        return mx.fast.scaled_dot_product_attention(x, x, x, scale=d**-0.5, mask="causal") * 1.0

    def f(x):
        for _ in range(blocks):
            x = (mx.checkpoint(block) if checkpoint else block)(x)
        return x.astype(mx.float32).sum()

    return mx.grad(f)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_unfused_attention_keeps_one_probability_tensor_per_block(checkpoint):
    """Training attention unfused (the CPU always, Metal since mlx 0.25) keeps one
    B x H x T x T tensor per block in the model dtype; mx.checkpoint keeps none."""
    import mlx.core as mx

    B, H, T, d = 4, 4, 256, 32
    q = mx.random.normal((B, H, T, d), key=mx.random.key(0)).astype(mx.bfloat16)
    P = B * H * T * T * 2
    with mx.stream(mx.cpu):
        four, eight = (graph_peak(_attention_grad(n, checkpoint, d), q) for n in (4, 8))
    per_block = (eight - four) / 4 / P
    if checkpoint:
        assert per_block < 0.3
    else:  # one P, plus the block's B x H x T x d output and its copy (2 x d / T = 0.25 P)
        assert 1.0 < per_block < 1.4


def test_unfused_cross_entropy_holds_twice_the_logits_on_cpu():
    """The CPU runs nn.losses.cross_entropy unfused (mx.fast.cross_entropy only on the
    GPU): its backward holds 2 x the logits beyond them, 3 x in all (docs/estimate.md)."""
    import mlx.core as mx
    import mlx.nn as nn

    assert "mx.default_device() == mx.gpu" in inspect.getsource(nn.losses.cross_entropy)
    B, T, V = 4, 256, 4096
    logits = mx.random.normal((B, T, V), key=mx.random.key(1)).astype(mx.bfloat16)
    targets = mx.random.randint(0, V, (B, T), key=mx.random.key(2))
    grad = mx.grad(lambda x: nn.losses.cross_entropy(x, targets).astype(mx.float32).sum())
    with mx.stream(mx.cpu):
        ratio = graph_peak(grad, logits) / (B * T * V * 2)
    assert 1.8 < ratio < 2.3


# -- the backend terms -----------------------------------------------------------------------

def test_runtime_follows_the_mlx_version():
    assert Runtime.of_versions("metal", (0, 32, 3)).fused_cross_entropy
    assert not Runtime.of_versions("metal", (0, 32, 1)).fused_cross_entropy
    assert not Runtime.of_versions("cpu", (0, 32, 4)).fused_cross_entropy
    # mlx 0.24's fused attention forward keeps the same memory (its VJP recomputes the unfused graph)
    assert Runtime.of_versions("metal", (0, 24, 1)) == Runtime.of_versions("metal", (0, 25, 0))


def test_fused_cross_entropy_holds_less_than_the_unfused():
    model = from_catalog("Qwen/Qwen3-0.6B")
    t = TrainingConfig(batch_size=4, max_seq_length=1024, grad_checkpoint=True)
    fused = estimate(model, t, "metal", runtime=Runtime(fused_cross_entropy=True))
    unfused = estimate(model, t, "metal", runtime=Runtime(fused_cross_entropy=False))
    assert fused.features["logits_bytes"] == 0 and fused.features["logits_fused_bytes"] > 0
    assert fused.peak_bytes < unfused.peak_bytes


def test_uncompiled_step_keeps_more():
    model = from_catalog("meta-llama/Llama-3.2-1B-Instruct")
    t = TrainingConfig(batch_size=4, max_seq_length=2048)
    compiled = estimate(model, t, "metal", runtime=Runtime(fused_cross_entropy=False))
    plain = estimate(model, t, "metal", runtime=Runtime(fused_cross_entropy=False, compiled_step=False))
    assert plain.peak_bytes > compiled.peak_bytes


def test_lora_keys_adapt_only_those_layers():
    """mlx-lm before 0.28.2 adapted q_proj and v_proj only: rank x (in + out) each."""
    model = from_catalog("meta-llama/Llama-3.2-1B-Instruct")  # h 2048, kv 8 x 64
    qv = estimate(model, TrainingConfig(lora_keys=ev.QV), "metal")
    every = estimate(model, TrainingConfig(), "metal")
    assert qv.features["trainable_elements"] == 16 * 8 * ((2048 + 2048) + (2048 + 512))
    assert qv.features["trainable_elements"] < every.features["trainable_elements"]
    assert qv.features["adapter_act_bytes"] < every.features["adapter_act_bytes"]


def test_yaml_lora_keys_reach_the_estimate(tmp_path):
    config = tmp_path / "lora.yaml"
    config.write_text("lora_parameters:\n  rank: 8\n  scale: 20.0\n  dropout: 0.0\n  keys: [self_attn.q_proj, self_attn.v_proj]\n")
    result = CliRunner().invoke(cli, ["probe", "--model", "meta-llama/Llama-3.2-1B-Instruct", "-c", str(config),
                                      "--memory", "36GB", "--json"], catch_exceptions=False)
    data = json.loads(result.output)
    assert data["training"]["lora_keys"] == list(ev.QV)


# -- ranges and verdicts -----------------------------------------------------------------------

def test_verdict_respects_the_range():
    assert judge(8, 10, 10) is Verdict.FITS
    assert judge(8, 11, 10) is Verdict.TIGHT
    assert judge(11, 12, 10) is Verdict.DOES_NOT_FIT


@pytest.mark.parametrize("backend", ["cpu", "metal", "cuda"])
def test_every_estimate_has_a_range(backend):
    for model in ("Qwen/Qwen3-0.6B", "7B"):
        result = CliRunner().invoke(cli, ["probe", "--model", model, "--backend", backend, "--memory", "36GB", "--json"],
                                    catch_exceptions=False)
        for e in json.loads(result.output)["estimates"]:
            low, high = e["predicted_range_bytes"]
            assert low <= e["predicted_peak_bytes"] <= high and e["range_basis"]


def test_cuda_range_is_wider_than_metal_and_metal_no_narrower_than_cpu():
    r = ranges()
    assert r["cuda"]["low"] < r["metal"]["low"] <= r["cpu"]["low"]
    assert r["cuda"]["high"] > r["metal"]["high"] >= r["cpu"]["high"]
    assert predicted_range(10**9, "metal") == (int(10**9 * r["metal"]["low"]), int(-(-10**9 * r["metal"]["high"] // 1)))


def test_text_shows_the_range():
    result = CliRunner().invoke(cli, ["probe", "--model", "Qwen/Qwen3-0.6B", "--memory", "36GB"], catch_exceptions=False)
    assert "GB (" in result.output and "–" in result.output


# -- the public runs -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mac_runs.csv", "mac_runs_2026.csv", "mac_runs_found.csv"])
def test_every_public_run_is_reproduced_or_skipped_with_a_reason(name):
    rows = _rows(name)
    runs = [run for run in ev.RUNS if run.file == name]
    skipped = set(ev.SKIPPED) if name == "mac_runs.csv" else set()
    used = {run.row for run in runs}
    assert used | skipped == set(range(len(rows))) and not used & skipped
    for run in runs:
        logged = rows[run.row]["peak_gb"]
        assert f"{run.peak_gb:g}" in logged or str(run.peak_gb) in logged, (run.key, logged)
        assert run.trust == rows[run.row]["trust"], run.key


def test_gemma4_kv_shared_blocks_adapt_only_q_and_o():
    """Gemma 4 E4B's last 18 blocks reuse earlier blocks' KV and have no k/v projections:
    with keys q,k,v,o at rank 16 on the last 16 blocks the adapters hold 2.56M weights, as
    the ablation's author measured (mac_runs_2026.csv)."""
    from mlxfit.estimate.detailed import counted_totals

    run = next(r for r in ev.RUNS if r.key == "gemma4-ckpt-on")
    model, training = run.model_info(), run.training_config()
    assert counted_totals(model, training)[1] == 2_555_904
    paths = {lin.path for lin in model.architecture.blocks[-1].linears}
    assert "self_attn.q_proj" in paths and "self_attn.k_proj" not in paths


def test_found_runs_match_their_printed_adapter_sizes():
    """Each found run's LoRA keys and block count reproduce the 'Trainable parameters' its log prints."""
    from mlxfit.estimate.detailed import counted_totals

    printed = {"mistral7b-8-layers-2048": 851_968, "mistral7b-16-layers": 1_703_936, "qwen2.5-3b-cpt": 3_325_952,
               "qwen2.5-3b-ift": 6_651_904, "gemma2-2b-b2": 6_389_760}
    for key, n in printed.items():
        run = next(r for r in ev.RUNS if r.key == key)
        assert counted_totals(run.model_info(), run.training_config())[1] == n, key


def test_runs_are_read_with_their_mlx_lm():
    pr53 = next(r for r in ev.RUNS if r.key == "pr53-post")
    assert pr53.training_config().lora_keys == ev.QV  # before 0.28.2
    assert pr53.lengths() == (2024, 2048)  # multiple-of-8 padding before 2025-03-27
    qdora = next(r for r in ev.RUNS if r.key == "mlx-examples#891")
    assert qdora.training_config().num_layers == -1  # the all-layers bug before 2025-02-20
    assert ev.padded_length(100, "2025-07-31", 2048) == 129


def test_every_oom_report_with_a_known_machine_does_not_fit_or_is_tight():
    rows = _rows("mac_oom_reports.csv")
    covered = {oom.row for oom in ev.OOM_RUNS}
    for i, row in enumerate(rows):
        assert i in covered or i in ev.OOM_SKIPPED, row["source_url_or_ref"]
    for oom in ev.OOM_RUNS:
        assert float(rows[oom.row]["machine_ram_gb"]) == oom.machine_gb
        plan = ev.oom_plan(oom)
        assert plan.selected.verdict in (Verdict.DOES_NOT_FIT, Verdict.TIGHT), (oom.key, plan.selected.predicted_range_bytes)


def test_cpu_range_is_the_accuracy_grids_cross_validated_spread():
    from mlxfit.estimate.uncertainty import quantile

    rows = list(csv.DictReader(open(EVIDENCE.parent / "results" / "accuracy.csv")))
    ratios = [int(r["measured_bytes"]) / int(r["cv_predicted_bytes"]) for r in rows]
    cpu = ranges()["cpu"]
    tail = _mac_evidence().CPU_TAIL
    assert cpu["low"] == round(quantile(ratios, tail), 4) and cpu["high"] == round(quantile(ratios, 1 - tail), 4)
    inside = sum(cpu["low"] <= x <= cpu["high"] for x in ratios) / len(ratios)
    assert inside >= 0.94


def test_quantile_matches_numpy():
    import numpy as np

    from mlxfit.estimate.uncertainty import quantile

    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (0.0, 0.05, 0.5, 0.95, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))


# -- the fit and its cross-validation (benchmarks/mac_evidence.py) ------------------------------

def _mac_evidence():
    import mac_evidence

    return mac_evidence


def test_shipped_metal_coefficients_are_the_fit_on_the_public_runs():
    """If the features change (or the evidence), rerun `benchmarks/mac_evidence.py --fit`."""
    from mlxfit.estimate.detailed import coefficients

    me = _mac_evidence()
    cases = [me.Case(r) for r in me.evidence_runs()[0] if r.backend == "metal"]
    fitted, _ = me.fit(cases, me.base_coefficients(), under=ranges()["metal"]["under_weight"])
    shipped = coefficients()
    for name, value in fitted.items():
        assert shipped["metal"][name] == pytest.approx(float(value), rel=1e-3, abs=1e-3), name
    assert shipped["cuda"] == shipped["metal"]


def test_ranges_are_per_kind_and_asymmetric():
    from mlxfit.estimate.uncertainty import range_factors

    kinds = ranges()["metal"]["kinds"]
    assert set(kinds) == {"lora", "lora-ckpt", "dora", "full"}
    assert range_factors("metal", kind="lora") == (kinds["lora"]["low"], kinds["lora"]["high"])
    assert range_factors("metal", kind="unknown") == range_factors("metal")
    lo, hi = range_factors("metal", kind="lora")
    assert 1 - lo != hi - 1  # asymmetric, as the residuals are
