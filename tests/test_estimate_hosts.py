"""Discrete GPUs and several Macs: per-node budgets and estimates."""

import json

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from conftest import CUDA_24GB, LINUX_CPU


def run_json(*args):
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_discrete_gpu_never_counts_system_ram(platform):
    platform(CUDA_24GB)
    data = run_json("probe", "--model", "Qwen/Qwen2.5-1.5B-Instruct")
    machine = data["machine"]
    assert machine["total_bytes"] == 25757220864 and not machine["unified"]
    assert machine["usable_bytes"] < CUDA_24GB.system_total / 4
    assert data["backend"] == "cuda"
    text = " ".join(CliRunner().invoke(cli, ["probe", "--model", "Qwen/Qwen2.5-1.5B-Instruct"]).output.split())
    assert "system RAM does not count" in text


def test_cuda_fused_attention_drops_the_scores():
    from mlxfit.estimate.detailed import estimate
    from mlxfit.model.resolve import from_catalog
    from mlxfit.model.training import TrainingConfig

    model = from_catalog("meta-llama/Llama-3.2-1B-Instruct")
    # mlx-lm pads to 1 + 32k tokens, so the model sees 32k: 1025 -> 1024, a multiple of 128.
    fused = estimate(model, TrainingConfig(max_seq_length=1025), "cuda").parts["attention scores"]
    unfused = estimate(model, TrainingConfig(max_seq_length=1025), "metal").parts["attention scores"]
    assert fused < unfused / 100
    # Off a multiple of 128 the backward recomputes one block's probabilities at a time
    # (docs/estimate.md): none kept across blocks, one block's recomputed.
    odd = estimate(model, TrainingConfig(max_seq_length=1057), "cuda").features
    one_block = 4 * 32 * 1056 * 1056 * 2
    assert odd["scores_bytes"] == 0 and odd["scores_recompute_bytes"] == odd["scores_once_bytes"] == one_block


def test_hosts_split_the_batch_and_add_all_reduce_buffers(platform):
    platform(LINUX_CPU)
    one = run_json("probe", "--model", "Qwen/Qwen3-0.6B", "--batch-size", "4")
    two = run_json("probe", "--model", "Qwen/Qwen3-0.6B", "--batch-size", "4", "--hosts", "2")
    lora1 = next(e for e in one["estimates"] if e["method"] == "lora")["breakdown"]
    lora2 = next(e for e in two["estimates"] if e["method"] == "lora")["breakdown"]
    assert lora2["activations"] * 2 == pytest.approx(lora1["activations"], rel=0.01)
    # The buffers live during the update, after the backward pass has freed its
    # activations: a short full fine-tune peaks there, a LoRA run does not.
    assert lora2["all-reduce buffers"] == lora1["all-reduce buffers"] == 0
    full = run_json("probe", "--model", "Qwen/Qwen3-0.6B", "--method", "full", "--batch-size", "2",
                    "--max-seq-length", "64", "--hosts", "2")
    selected = next(e for e in full["estimates"] if e["selected"])
    assert selected["peak_phase"] == "update"
    parts = selected["breakdown"]
    assert parts["all-reduce buffers"] == 2 * parts["weights (trainable)"]
    assert parts["gradients"] == parts["weights (trainable)"]  # all of them, before the all-reduce


def test_batch_must_divide_by_hosts():
    result = CliRunner().invoke(cli, ["probe", "--batch-size", "3", "--hosts", "2"])
    assert result.exit_code == 2 and "divisible by the number of workers" in result.output


def test_hostfile_checks_every_host(tmp_path, platform):
    platform(LINUX_CPU)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([
        {"ssh": "studio", "ips": ["192.0.2.1"], "memory": "64GB"},
        {"ssh": "air", "ips": ["192.0.2.2"], "memory": "8GB"},
    ]))
    data = run_json("probe", "--model", "Qwen/Qwen3-4B", "--batch-size", "4", "--max-seq-length", "1024", "--hostfile", str(hostfile))
    hosts = {h["host"]: h for h in data["hosts"]}
    assert data["training"]["hosts"] == 2 and data["backend"] == "metal"
    assert hosts["studio"]["fits"] and not hosts["air"]["fits"]
    assert hosts["studio"]["usable_bytes"] == 48 * 10**9


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "lists no hosts"),
        ('[{"ssh": "a"}]', "has no 'memory'"),
        ('[{"ssh": "a", "memory": "lots"}]', "not a memory size"),
    ],
)
def test_bad_hostfiles(tmp_path, content, message):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(content)
    result = CliRunner().invoke(cli, ["probe", "--hostfile", str(hostfile)])
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "content, problem",
    [
        ('[{"ssh": "caf\xe9", "memory": "36GB"}]'.encode("latin-1"), "is not UTF-8 text (byte 0xe9 at line 1, column 14)"),
        (bytes(range(256)), "is a binary file, not UTF-8 text"),
    ],
)
def test_hostfile_not_utf8_is_one_line(tmp_path, content, problem):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_bytes(content)
    result = CliRunner().invoke(cli, ["probe", "--hostfile", str(hostfile)])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(f"Error: hostfile {hostfile} {problem}")
