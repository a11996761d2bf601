"""The CLI end to end: JSON fields, verdicts, bad input, and no heavy imports."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from conftest import GB, LINUX_CPU, MAC_36GB
from tiny_configs import TINY


def run(*args, exit_code=0):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    return result


def run_json(*args):
    return json.loads(run(*args, "--json").output)


def estimates(data):
    return {e["method"]: e for e in data["estimates"]}


def test_probe_7b_on_a_36gb_laptop(platform):
    platform(LINUX_CPU)
    data = run_json("probe", "--model", "7B", "--memory", "36GB")
    by = estimates(data)
    # The rule's figures against the budget, each row judged on the range it shows.
    assert by["lora"]["rule_bytes"] == 17 * GB and by["lora"]["verdict"] == "tight" and not by["lora"]["fits"]
    assert by["full"]["rule_bytes"] == 88 * GB and by["full"]["verdict"] == "does not fit"
    assert data["machine"]["usable_bytes"] == 27 * GB
    assert set(data["machine"]) >= {"total_bytes", "used_bytes", "available_bytes", "reserve_bytes", "usable_bytes", "backend", "unified"}
    assert set(data["model"]) >= {"id", "model_type", "params", "bits"}


def test_probe_catalog_model_offline():
    data = run_json("probe", "--model", "Qwen/Qwen2.5-7B-Instruct")
    assert data["model"]["params"] == 7_615_616_512
    assert data["model"]["source"] == "catalog" and data["model"]["model_type"] == "qwen2"
    assert estimates(data)["lora"]["rule_bytes"] == pytest.approx(18.2 * GB, rel=0.002)


def test_catalog_ids_match_case_insensitively():
    data = run_json("probe", "--model", "qwen/QWEN2.5-7b-instruct")
    assert data["model"]["id"] == "Qwen/Qwen2.5-7B-Instruct"


def test_mlx_community_quantized_name_is_qlora():
    data = run_json("probe", "--model", "mlx-community/Qwen2.5-7B-Instruct-4bit")
    assert data["model"]["bits"] == 4
    assert estimates(data)["qlora"]["selected"]


def test_probe_default_model_works_offline():
    data = run_json("probe")
    assert data["model"]["id"] == "Qwen/Qwen3-0.6B"
    assert estimates(data)["lora"]["selected"]


def test_probe_text_output(platform):
    platform(MAC_36GB)
    out = run("probe", "--model", "14B").output
    assert "does not fit" in out and "--method qlora" in out
    assert "GB = 10^9 bytes" in out


def test_local_quantized_folder(model_folder):
    config = dict(TINY["qwen2"], quantization={"group_size": 32, "bits": 4})
    data = run_json("probe", "--model", str(model_folder(config)), "--num-layers", "-1")
    assert data["model"]["source"] == "local"
    assert (data["model"]["bits"], data["model"]["group_size"]) == (4, 32)


def run_fresh_process(args, env_extra):
    """huggingface_hub reads HF_HOME and HF_HUB_OFFLINE when first imported, so
    hub lookups are tested in a fresh interpreter with the environment set (and no proxy)."""
    import os

    env = dict({k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}, **env_extra)
    return subprocess.run([sys.executable, "-m", "mlxfit", *args], capture_output=True, text=True, env=env, timeout=60)


def test_hub_id_read_from_the_huggingface_cache(tmp_path):
    # A real huggingface_hub cache entry, as hf_hub_download lays it out.
    repo = tmp_path / "hf" / "hub" / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    (snapshot / "config.json").write_text(json.dumps(TINY["llama"]))
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = run_fresh_process(["probe", "--model", "someone/tiny-llama", "--num-layers", "2", "--json"], env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"]["source"] == "hub" and data["model"]["params"] == 90432


def test_unreachable_hub_is_one_line_without_retries(tmp_path):
    """No network, HF_HUB_OFFLINE unset: one line at once, not five retries 8 s apart."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}
    result = run_fresh_process(["probe", "--model", "nobody/not-a-model"], env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: unknown model 'nobody/not-a-model': not a local folder, not in the built-in catalog "
        "(`mlxfit models`), not in the Hugging Face cache, and http://127.0.0.1:9 cannot be reached (offline?)"
    )


# Run mlxfit with every name but the loopback's unresolvable: nothing leaves the machine.
LOOPBACK_ONLY = """
import socket, sys
real = socket.getaddrinfo
def loopback_only(host, *args, **kwargs):
    if host in ("127.0.0.1", "localhost"):
        return real(host, *args, **kwargs)
    print(f"direct: {host}", file=sys.stderr)
    raise socket.gaierror(socket.EAI_NONAME, "this test reaches nothing but 127.0.0.1")
socket.getaddrinfo = loopback_only
from mlxfit.cli.main import cli
cli(sys.argv[1:], prog_name="mlxfit")
"""


def run_loopback_only(args, env_extra):
    import os

    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", LOOPBACK_ONLY, *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def refusing_proxy():
    """A proxy on 127.0.0.1 that answers every request 403 and notes its first line."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    seen = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head and (chunk := conn.recv(4096)):
                    head += chunk
                if head:
                    seen.append(head.split(b"\r\n")[0].decode())
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    server.close()


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
def test_the_hub_is_asked_through_the_proxy_of_the_environment(tmp_path, refusing_proxy, variable):
    proxy, seen = refusing_proxy
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", variable: proxy}
    result = run_loopback_only(["probe", "nobody/not-a-model"], env)
    assert result.returncode == 1
    assert "CONNECT huggingface.co:443 HTTP/1.1" in seen  # huggingface_hub's own request went through it
    assert result.stderr.strip() == (
        f"Error: could not fetch config.json of 'nobody/not-a-model' through the proxy {proxy}: 403 Forbidden")


def test_a_proxy_that_cannot_be_reached_is_named_without_its_password(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", "HTTPS_PROXY": "http://me:secret@127.0.0.1:9"}
    result = run_loopback_only(["probe", "nobody/not-a-model"], env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: unknown model 'nobody/not-a-model': not a local folder, not in the built-in catalog "
        "(`mlxfit models`), not in the Hugging Face cache, and the proxy http://127.0.0.1:9 (from the environment) "
        "cannot be reached"
    )


def test_no_proxy_sends_the_hub_direct(tmp_path, refusing_proxy):
    proxy, seen = refusing_proxy
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", "HTTPS_PROXY": proxy, "NO_PROXY": "huggingface.co"}
    result = run_loopback_only(["probe", "nobody/not-a-model"], env)
    assert result.returncode == 1 and seen == []
    assert result.stderr.splitlines()[0] == "direct: huggingface.co"  # refused by the test, as offline
    assert result.stderr.strip().endswith("https://huggingface.co cannot be reached (offline?)")


def test_unknown_hub_id_offline(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = run_fresh_process(["probe", "--model", "nobody/not-a-model"], env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: unknown model 'nobody/not-a-model': not a local folder, not in the built-in "
        "catalog, and its config.json is not in the Hugging Face cache (offline?)"
    )


def test_fits_table_json(platform):
    platform(LINUX_CPU)
    rows = run_json("fits", "--memory", "36GB")["rows"]
    by_size = {r["params"]: {e["method"]: e["verdict"] for e in r["estimates"]} for r in rows}
    # The rule's figures, judged with the rule's range over the public Mac runs (mlxfit/data/ranges.json).
    assert by_size[7 * 10**9] == {"lora": "tight", "qlora": "fits", "full": "does not fit"}
    assert by_size[1_500_000_000]["full"] == "tight"
    # The table is each row's "answer" (the catalog model, detailed); the JSON says which is which.
    data = run_json("fits", "--memory", "36GB")
    assert set(data["basis"]) == {"answer", "estimates"} and data["basis"]["estimates"].startswith("rule")
    answer = {r["params"]: r["answer"] for r in data["rows"]}
    assert answer[7 * 10**9]["lora"]["basis"] == "detailed" and answer[7 * 10**9]["lora"]["verdict"] == "does not fit"


def test_memory_json_on_a_recorded_mac(platform):
    platform(MAC_36GB)
    machine = run_json("memory")["machine"]
    assert machine["backend"] == "metal" and machine["unified"]
    assert machine["usable_bytes"] == machine["total_bytes"] - machine["reserve_bytes"]


def test_memory_gib_unit(platform):
    platform(LINUX_CPU)
    assert run_json("memory", "--memory", "36GiB")["machine"]["total_bytes"] == 36 * 2**30


def test_models_lists_the_catalog():
    rows = {m["id"]: m for m in run_json("models")["models"]}
    assert {"Qwen/Qwen3-30B-A3B", "mistralai/Mixtral-8x7B-Instruct-v0.1", "google/gemma-3-1b-it"} <= set(rows)
    moe = rows["Qwen/Qwen3-30B-A3B"]
    assert (moe["family"], moe["params"]) == ("Qwen3", 30_532_122_624)
    assert moe["active_params"] < moe["params"] / 8 and "MoE 128×top-8" in moe["architecture"]
    assert "sliding" in rows["google/gemma-3-1b-it"]["architecture"]
    text = run("models").output
    assert "Llama 3.2" in text and "meta-llama/Llama-3.2-1B-Instruct" in text


def test_models_spells_families_as_their_makers_do():
    """Family names as the makers write them, not as the hub id's words fall
    (gemma-2-2b-it is Google's Gemma 2, phi-4 Microsoft's Phi-4)."""
    families = {m["family"] for m in run_json("models")["models"]}
    assert {"Gemma 2", "Gemma 3", "Phi-3-mini", "Phi-4", "Phi-4-mini", "gpt-oss", "Granite 3.1",
            "Qwen2.5-Coder", "Mistral NeMo", "Llama 3.2", "Qwen3.5"} <= families
    assert not families & {"gemma 2", "phi 4", "gpt oss", "granite 3.1", "Qwen2.5 Coder"}
    # a family name begins as its maker begins it: capitalised, or gpt-oss as OpenAI writes it
    assert all(f[0].isupper() or f == "gpt-oss" for f in families), sorted(families)


def test_any_id_of_a_family_gets_its_makers_spelling():
    """family() is what `models` shows for every catalog id, and an mlx-community
    conversion of a model is of the same family."""
    from mlxfit.model.resolve import family

    for row in run_json("models")["models"]:
        assert family(row["id"]) == row["family"], row["id"]
    assert family("mlx-community/gemma-2-9b-it-4bit") == "Gemma 2"
    assert family("mlx-community/phi-4-8bit") == "Phi-4"
    assert family("mlx-community/Qwen2.5-Coder-7B-Instruct-4bit") == "Qwen2.5-Coder"
    assert family("someone/Llama-3.2-1B-Instruct") == "Llama 3.2"


def test_help_and_version():
    assert "Examples" in run("-h").output
    assert "0.1.0" in run("--version").output


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["probe", "--model", "gibberish"], 1, "unknown model 'gibberish'"),
        (["probe", "--memory", "abc"], 2, "not a memory size: 'abc'"),
        (["probe", "--memory", "-4GB"], 2, "not a memory size"),
        (["probe", "--memory", "0GB"], 2, "memory size must be positive"),
        (["probe", "--memory", "1B"], 2, "'1B' is 1 byte, under 1 MB: give the unit"),
        (["memory", "--memory", "12XB"], 2, "unknown unit 'XB'"),
        (["probe", "--model", "0B"], 2, "model size must be positive"),
        (["probe", "--batch-size", "0"], 2, "batch-size must be at least 1"),
        (["probe", "--max-seq-length", "0"], 2, "max-seq-length must be at least 1"),
        (["probe", "--num-layers", "99"], 2, "Requested to train 99 layers but the model only has 28 layers"),
        (["probe", "--reserve", "2"], 2, "reserve must be a fraction"),
        # Flags that would change nothing are named, not dropped.
        (["probe", "--beta", "0.5"], 2, "--beta is mlx_lm_lora.train's: add --train-mode"),
        (["probe", "--steps", "4"], 2, "--steps is about measuring: add --measure"),
        (["probe", "--timeout", "60"], 2, "--timeout is about measuring: add --measure"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_status(args, code, message):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == code
    assert message in result.output
    assert "Traceback" not in result.output


def test_folder_without_config(tmp_path):
    result = CliRunner().invoke(cli, ["probe", "--model", str(tmp_path)])
    assert result.exit_code == 1 and "has no config.json" in result.output


def test_malformed_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    result = CliRunner().invoke(cli, ["probe", "--model", str(tmp_path)])
    assert result.exit_code == 1 and "is not valid JSON" in result.output


@pytest.mark.parametrize(
    "content, problem",
    [
        ('{"model_type": "llama", "name": "caf\xe9"}'.encode("latin-1"),
         "is not UTF-8 text (byte 0xe9 at line 1, column 37): save it as UTF-8"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff", "is a binary file, not UTF-8 text"),
    ],
)
def test_config_not_utf8_is_one_line(tmp_path, content, problem):
    (tmp_path / "config.json").write_bytes(content)
    result = CliRunner().invoke(cli, ["probe", "--model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {tmp_path / 'config.json'} {problem}"


def test_unreadable_config_is_one_line(tmp_path):
    (tmp_path / "config.json").mkdir()  # not a file: from_folder says so
    assert "has no config.json" in CliRunner().invoke(cli, ["probe", "--model", str(tmp_path)]).output
    config = tmp_path / "sub" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY["llama"]))
    config.chmod(0)
    try:
        if os.access(config, os.R_OK):
            pytest.skip("running as root: every file is readable")
        result = CliRunner().invoke(cli, ["probe", "--model", str(config.parent)])
    finally:
        config.chmod(0o644)
    assert result.exit_code == 1 and result.output.strip() == f"Error: cannot read {config}: Permission denied"


def test_unknown_model_type_gets_the_rule_from_its_config(model_folder):
    config = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
              "intermediate_size": 3072, "vocab_size": 30522}
    result = CliRunner().invoke(cli, ["probe", "--model", str(model_folder(config)), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["model"]["params"] > 100_000_000
    assert "no model for model_type 'bert'" in data["model"]["rule_only_reason"]
    assert {e["basis"] for e in data["estimates"]} == {"rule"}


def test_unknown_model_type_counts_from_the_safetensors_index(model_folder):
    folder = model_folder({"model_type": "future_model", "torch_dtype": "bfloat16"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * 7_000_000_000}, "weight_map": {}}))
    result = CliRunner().invoke(cli, ["probe", "--model", str(folder)])
    assert result.exit_code == 0, result.output
    assert "7,000,000,000 parameters (model.safetensors.index.json)" in " ".join(result.output.split())


def test_unknown_model_type_without_sizes_is_one_line(model_folder):
    result = CliRunner().invoke(cli, ["probe", "--model", str(model_folder({"model_type": "bert"}))])
    assert result.exit_code == 1 and "no model for model_type 'bert'" in result.output
    assert "Traceback" not in result.output


def test_debug_switch_reraises(monkeypatch):
    monkeypatch.setenv("MLXFIT_DEBUG", "1")
    result = CliRunner().invoke(cli, ["probe", "--model", "gibberish"])
    assert result.exception is not None and "unknown model" in str(result.exception)


def test_estimate_path_never_imports_transformers():
    """It builds mlx-lm's model classes (mlx_lm.models.*, mlx_lm.tuner.lora) but
    never runs mlx-lm's package __init__, which imports transformers."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from mlxfit.cli.main import cli\n"
        "from mlxfit.model import facts\n"
        "facts.USE_SHIPPED = False  # build the models (the catalog's answers otherwise ship with the package)\n"
        "for args in (['probe'], ['probe', '--model', 'Qwen/Qwen2.5-7B-Instruct', '--json'],\n"
        "             ['probe', '--model', 'Qwen/Qwen3-30B-A3B', '--method', 'qlora', '--json'], ['fits'], ['memory']):\n"
        "    r = CliRunner().invoke(cli, args)\n"
        "    assert r.exit_code == 0, r.output\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'huggingface_hub', 'tokenizers'))\n"
        "print(heavy, 'mlx_lm.models.qwen3_moe' in sys.modules, 'mlx_lm.utils' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] True False"


def test_grpo_estimate_times_the_decoding_loop_without_transformers(tmp_path):
    """A GRPO estimate on this machine times mlx-lm's decoding loop the first time (an
    empty cache here), with mlx-lm's pieces, never mlx_lm.generate: transformers is
    never imported, and --json is the JSON alone (no notice of transformers' in it)."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False, "torch_dtype": "float32"}))
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from mlxfit.cli.main import cli\n"
        f"r = CliRunner().invoke(cli, ['probe', '--model', {str(tmp_path)!r}, '--train-mode', 'grpo', '--num-layers', '-1',\n"
        "                             '--group-size', '2', '--max-completion-length', '8', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        "sys.stdout.write(r.output)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('transformers', 'huggingface_hub', 'tokenizers'))\n"
        "print(heavy, 'mlx_lm.generate' in sys.modules, file=sys.stderr)\n"
    )
    env = {**os.environ, "MLXFIT_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    answer = json.loads(done.stdout)
    assert answer["time"]["step_seconds"] > 0
    assert done.stderr.strip().splitlines()[-1] == "[] False"
    assert "decoding loop" in (tmp_path / "cache" / "decode_loop_rate.json").read_text()


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "mlxfit", "--version"], capture_output=True, text=True, check=True).stdout
    assert "mlxfit" in out


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 0}, "config.json field 'hidden_size' must be positive, got 0"),
        ({"vocab_size": -10}, "config.json field 'vocab_size' must be positive, got -10"),
        ({"hidden_size": "wide"}, "config.json field 'hidden_size' must be an integer, got 'wide'"),
        ({"num_attention_heads": 3, "num_key_value_heads": 1},
         "config.json: hidden_size (64) is not a multiple of num_attention_heads (3) and there is no head_dim"),
        ({"num_attention_heads": 4, "num_key_value_heads": 3},
         "config.json: num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
        ({"num_hidden_layers": 100_000},
         "config.json field 'num_hidden_layers' is 100,000, over the 1,024 mlxfit sizes: no real model comes near "
         "(the deepest have about 130 layers), so it is most likely a mistake"),
        ({"num_hidden_layers": 10**7}, "config.json field 'num_hidden_layers' is 10,000,000, over the 1,024"),
        ({"vocab_size": 10**9}, "config.json field 'vocab_size' is 1,000,000,000, over the 16,777,216 mlxfit sizes"),
        ({"text_config": {"hidden_size": 10**6}}, "config.json field 'text_config.hidden_size' is 1,000,000, over the 131,072"),
        ({"intermediate_size": [128, 10**8]}, "config.json field 'intermediate_size' is 100,000,000, over the 1,048,576"),
        ({"num_hidden_layers": 1000, "num_local_experts": 512},
         "config.json: num_hidden_layers × num_local_experts is 1,000 × 512 = 512,000, over the 65,536 mlxfit sizes: "
         "no real model comes near (the most have about 25,000: 48 layers × 512 experts), so it is most likely a mistake"),
    ],
)
def test_bad_config_values_are_one_line(model_folder, change, message):
    result = CliRunner().invoke(cli, ["probe", "--model", str(model_folder({**TINY["llama"], **change}))])
    assert result.exit_code == 1
    assert result.output.strip().startswith(f"Error: {message}") and len(result.output.strip().splitlines()) == 1


def test_every_model_the_catalog_and_the_tests_know_is_within_bounds():
    from mlxfit.model.bounds import check_bounds
    from mlxfit.model.resolve import catalog

    for _, config in catalog().values():
        check_bounds(config)
    for config in TINY.values():
        check_bounds(config)


def test_the_bounded_products_are_what_building_costs():
    """Most MoE models stack their experts in one module; DBRX builds one per expert
    (its own bound in mlxfit/model/bounds.py)."""
    from mlxfit.model.lazy_model import build
    from mlxfit.model import module_tree

    def modules(config):
        return len(module_tree.modules(build(config)))

    dbrx = json.loads((Path(__file__).parent / "fixtures" / "tiny_configs.json").read_text())["dbrx"]
    more = {**dbrx, "ffn_config": {**dbrx["ffn_config"], "moe_num_experts": 2 * dbrx["ffn_config"]["moe_num_experts"]}}
    assert modules(more) > modules(dbrx)
    assert modules({**TINY["qwen3_moe"], "num_experts": 2 * TINY["qwen3_moe"]["num_experts"]}) == modules(TINY["qwen3_moe"])


def test_unmeasured_block_kinds_are_approximate_and_point_to_measure(platform):
    platform(LINUX_CPU)
    args = ("probe", "--model", "Qwen/Qwen3.5-4B", "--batch-size", "1", "--max-seq-length", "512")
    data = run_json(*args)
    assert {e["basis"] for e in data["estimates"]} == {"approximate"}
    assert "--measure" in " ".join(run(*args).output.split())
    assert {e["basis"] for e in run_json("probe", "--model", "Qwen/Qwen3-4B")["estimates"]} == {"detailed"}


def test_probe_answer_is_data_the_cli_only_prints(platform, capsys):
    """mlxfit.answer.probe returns probe's answer without printing; the CLI's JSON is its to_dict."""
    from mlxfit import answer

    platform(MAC_36GB)
    flags = {"batch_size": 2, "mask_prompt": None}
    got = answer.probe("Qwen/Qwen3-0.6B", flags, memory=16 * GB)
    assert capsys.readouterr() == ("", "")
    assert flags == {"batch_size": 2, "mask_prompt": None}  # the caller's flags are left as given
    assert got.to_dict() == run_json("probe", "Qwen/Qwen3-0.6B", "--memory", "16GB", "--batch-size", "2")


def test_the_answer_draws_nothing_and_nothing_below_imports_it():
    from test_estimate_plan import import_graph

    graph = import_graph()
    # probe's answer, the preference modes' and a vision-language model's beside it, and the Python API above them
    stage = ("mlxfit.answer", "mlxfit.answer_preference", "mlxfit.answer_vision", "mlxfit.api")
    for module in stage:
        assert not {d for d in graph[module] if d.startswith(("mlxfit.render", "mlxfit.cli"))}, module
    for module in stage:
        users = {m for m, deps in graph.items() if module in deps}
        exports = {"mlxfit"} if module == "mlxfit.api" else set()  # mlxfit/__init__.py: the API's names
        assert all(m.startswith(("mlxfit.cli", "mlxfit.render")) or m in stage or m in exports for m in users), (module, users)


def test_the_least_sure_kind_says_so():
    """Checkpointed full fine-tuning from 1,024 tokens (mlxfit/estimate/advice.py weak_kind_advice):
    the blind CPU checks found 3 of 10 such runs 13-22% low, so probe points to --measure."""
    long = run_json("probe", "--method", "full", "--grad-checkpoint", "--max-seq-length", "2048")
    assert any("least sure kind" in note and "--measure" in note for note in long["advice"])
    for flags in (["--max-seq-length", "512", "--grad-checkpoint"], ["--max-seq-length", "2048"]):
        assert not any("least sure kind" in note for note in run_json("probe", "--method", "full", *flags)["advice"])
    assert not any("least sure kind" in n for n in run_json("probe", "--grad-checkpoint", "--max-seq-length", "2048")["advice"])


def test_weights_file_as_model_is_refused_unread(tmp_path):
    weights = tmp_path / "model.safetensors"
    with weights.open("wb") as f:  # a header, then 64 GiB of holes: read whole, it would not fit in memory
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        f.truncate(64 << 30)
    result = CliRunner().invoke(cli, ["probe", "--model", str(weights)])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {weights} is a binary file, not UTF-8 text"
