"""A range spans what the estimate counts unverified on a GPU (mlxfit/estimate/unverified.py):
the fused cross-entropy of mlx >= 0.32.3 and gated delta's per-token loop, and says why."""

import json

from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.sizing import predict
from mlxfit.estimate.uncertainty import predicted_range
from mlxfit.estimate.unverified import FUSED_CROSS_ENTROPY, GATED_DELTA
from mlxfit.model.resolve import from_catalog
from mlxfit.model.training import TrainingConfig
from mlxfit.runtime import Runtime


def _selected(args):
    result = CliRunner().invoke(cli, ["probe", *args, "--json"], catch_exceptions=False)
    return next(e for e in json.loads(result.output)["estimates"] if e["selected"])


def test_fused_cross_entropy_range_covers_the_unfused_loss():
    model = from_catalog("Qwen/Qwen3-1.7B")
    t = TrainingConfig(batch_size=4, max_seq_length=2048)
    need, breakdown = predict(model, t, "metal", runtime=Runtime(fused_cross_entropy=True))
    unfused, _ = predict(model, t, "metal", runtime=Runtime(fused_cross_entropy=False))
    (span,) = breakdown.features["unverified"]
    assert span.mechanism == FUSED_CROSS_ENTROPY and span.peak_without_bytes == unfused > need
    e = _selected(["--model", "Qwen/Qwen3-1.7B", "--backend", "metal", "--memory", "36GB", "--batch-size", "4",
                   "--max-seq-length", "2048"])
    low, high = e["predicted_range_bytes"]
    assert low == predicted_range(e["predicted_peak_bytes"], "metal", kind="lora")[0]
    assert high == predicted_range(unfused, "metal", kind="lora")[1]
    assert e["range_spans"][0]["mechanism"] == FUSED_CROSS_ENTROPY and "0.32.3" in e["range_spans"][0]["why"]


def test_verified_runs_have_no_span():
    _, breakdown = predict(from_catalog("Qwen/Qwen3-1.7B"), TrainingConfig(), "cpu")
    assert "unverified" not in breakdown.features
    _, breakdown = predict(from_catalog("Qwen/Qwen3-1.7B"), TrainingConfig(), "metal",
                           runtime=Runtime(fused_cross_entropy=False))
    assert "unverified" not in breakdown.features
    assert "range_spans" not in _selected(["--model", "Qwen/Qwen3-0.6B", "--memory", "36GB", "--backend", "cpu"])


def test_gated_delta_range_covers_the_mac_report():
    """mlx#3539: Qwen3.5-4B (4-bit) at 512 tokens logged 10.92 GB on a Mac; the estimate with the
    per-token loop counted is about three times that, so the range spans its absence."""
    e = _selected(["--model", "Qwen/Qwen3.5-4B", "--backend", "metal", "--memory", "36GB", "--batch-size", "1",
                   "--max-seq-length", "512", "--grad-checkpoint", "--num-layers", "4"])
    spans = {s["mechanism"]: s for s in e["range_spans"]}
    assert GATED_DELTA in spans and spans[GATED_DELTA]["peak_without_bytes"] < e["predicted_peak_bytes"]
    low, high = e["predicted_range_bytes"]
    assert low <= 10.92e9 <= high


def test_text_says_why_the_range_is_wider():
    result = CliRunner().invoke(cli, ["probe", "--model", "Qwen/Qwen3-1.7B", "--backend", "metal", "--memory", "36GB"],
                                catch_exceptions=False)
    assert "The range covers the fused cross-entropy and its absence (-v: why)." in " ".join(result.output.split())
    verbose = CliRunner().invoke(cli, ["probe", "--model", "Qwen/Qwen3-1.7B", "--backend", "metal", "--memory", "36GB",
                                       "-v"], catch_exceptions=False)
    assert "The range spans the fused cross-entropy and its absence: MLX from 0.32.3" in " ".join(verbose.output.split())
