"""mlx.launch with two local ranks (ring backend, CPU): every rank's peak is
reported by rank 0 and matches one process training half the batch."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlxfit.measure.parent import measure, request_for
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig

EXAMPLE = Path(__file__).parent.parent / "examples" / "tiny-llama"
ARGS = ["--model", str(EXAMPLE), "--num-layers", "-1", "--max-seq-length", "128", "--measure", "--json"]


def launch_two_ranks(tmp_path):
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent)) or shutil.which("mlx.launch")
    if launcher is None:
        pytest.skip("mlx.launch is not installed")
    env = dict(os.environ, MLXFIT_CACHE_DIR=str(tmp_path / "cache"))
    command = [launcher, "--backend", "ring", "-n", "2", "--", sys.executable, "-m", "mlxfit", "probe", *ARGS, "--batch-size", "4", "--hosts", "2"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def test_two_ranks_report_their_peaks_and_agree_with_half_the_batch(tmp_path, monkeypatch, rates_in_cache):
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "cache"))  # the ranks' cache (launch_two_ranks)
    rates_in_cache("float32")  # read there by each rank, not timed again by both at once
    data = launch_two_ranks(tmp_path)
    ranks = data["measured"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    single = measure(request_for(from_folder(EXAMPLE), TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=128)), timeout=300)
    predicted = data["predicted_peak_bytes"]  # the --hosts 2 estimate
    for rank in ranks:
        # Each rank holds half the batch plus the all-reduce buffers.
        assert rank["peak_with_load_bytes"] == pytest.approx(single.peak_with_load_bytes, rel=0.05)
        assert abs(predicted - rank["peak_with_load_bytes"]) / rank["peak_with_load_bytes"] <= 0.15
