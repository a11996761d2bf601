"""mlxfit reads `mlx_lm.lora -c` files and merges them with flags exactly as mlx-lm does."""

import subprocess
import sys
from pathlib import Path

import mlx_lm.lora
import pytest
import yaml

from mlxfit.errors import BadInput, MlxfitError
from mlxfit.model.runconfig import CONFIG_KEYS, FEATURE_KEYS, load_yaml, resolve, yaml_loader

FIXTURES = Path(__file__).parent / "fixtures"
FLAG_KEYS = ("fine_tune_type", "optimizer", "num_layers", "batch_size", "max_seq_length",
             "grad_checkpoint", "grad_accumulation_steps", "model", "data", "mask_prompt")


def mlx_lm_args(argv, config_path):
    """What mlx_lm.lora.main() hands to run(): its own parser, loader and merging loops."""
    argv = list(argv) + (["-c", str(config_path)] if config_path else [])
    args = vars(mlx_lm.lora.build_parser().parse_args(argv))
    if args["config"]:
        with open(args["config"]) as file:
            config = yaml.load(file, mlx_lm.lora.yaml_loader)
        for k, v in config.items():
            if args.get(k, None) is None:
                args[k] = v
    for k, v in mlx_lm.lora.CONFIG_DEFAULTS.items():
        if args.get(k, None) is None:
            args[k] = v
    return args


def mlxfit_flags(argv):
    """The same command line as mlxfit's CLI would pass it: None for "not given"."""
    parsed = vars(mlx_lm.lora.build_parser().parse_args(list(argv)))
    return {k: parsed[k] for k in FLAG_KEYS}


CASES = [
    ([], None),
    (["--batch-size", "2", "--grad-checkpoint", "--fine-tune-type", "full"], None),
    ([], FIXTURES / "lora_full.yaml"),
    (["--batch-size", "1", "--max-seq-length", "512", "--optimizer", "sgd"], FIXTURES / "lora_full.yaml"),
    (["--fine-tune-type", "lora", "--num-layers", "-1", "--model", "other/model", "--data", "d"],
     FIXTURES / "lora_full.yaml"),
    ([], FIXTURES / "lora_small.yaml"),
    (["--mask-prompt", "--grad-accumulation-steps", "2"], FIXTURES / "lora_small.yaml"),
]


@pytest.mark.parametrize("argv, config_path", CASES)
def test_resolved_config_is_what_mlx_lm_uses(argv, config_path):
    theirs = mlx_lm_args(argv, config_path)
    ours = resolve(mlxfit_flags(argv), config_path)
    t = ours.training
    assert t.fine_tune_type == theirs["fine_tune_type"]
    assert t.optimizer == theirs["optimizer"].lower()  # train_model lower-cases it
    for key in ("num_layers", "batch_size", "max_seq_length", "grad_checkpoint", "grad_accumulation_steps"):
        assert getattr(t, key) == theirs[key], key
    lora = theirs["lora_parameters"]
    assert (t.rank, t.scale, t.dropout) == (lora["rank"], lora["scale"], lora["dropout"])
    assert t.lora_keys == (tuple(lora["keys"]) if lora.get("keys") is not None else None)
    assert (ours.model or mlx_lm.lora.CONFIG_DEFAULTS["model"]) == theirs["model"]
    assert (ours.data or mlx_lm.lora.CONFIG_DEFAULTS["data"]) == theirs["data"]
    assert ours.mask_prompt == theirs["mask_prompt"]
    for key in FEATURE_KEYS:
        assert ours.features.get(key) == theirs.get(key), key
    for key, value in ours.other.items():
        assert theirs[key] == value, key


def test_sources_and_json():
    argv = ["--batch-size", "1"]
    ours = resolve(mlxfit_flags(argv), FIXTURES / "lora_full.yaml")
    assert ours.sources["batch_size"] == "flag"
    assert ours.sources["max_seq_length"] == "file"
    assert ours.sources["rank"] == "file" and ours.sources["lora_keys"] == "file"
    assert ours.sources["quantize"] == "default"
    assert ours.unknown_keys == ["training_mode"]
    out = ours.to_dict()
    assert out["config"]["batch_size"] == {"value": 1, "source": "flag"}
    assert out["config"]["learning_rate"] == {"value": 2e-5, "source": "file"}
    assert out["config"]["lora_keys"]["value"] == ["self_attn.q_proj", "self_attn.v_proj"]
    assert ours.training.lora_keys == ("self_attn.q_proj", "self_attn.v_proj")
    assert out["unknown_keys"] == ["training_mode"]

    small = resolve({}, FIXTURES / "lora_small.yaml")
    assert small.sources["max_seq_length"] == "default"  # null in the file
    assert small.training.scale == 8.0 and isinstance(small.training.scale, float)
    assert small.unknown_keys == ["wandb"]
    assert resolve({"rank": 32}, FIXTURES / "lora_small.yaml").training.rank == 32


def test_no_file_is_all_defaults():
    ours = resolve({k: None for k in FLAG_KEYS})
    assert set(ours.sources.values()) == {"default"}
    assert ours.model is None and ours.data is None and ours.unknown_keys == []


def test_known_keys_cover_mlx_lm():
    dests = {a.dest for a in mlx_lm.lora.build_parser()._actions} - {"help"}
    assert set(mlx_lm.lora.CONFIG_DEFAULTS) | dests <= CONFIG_KEYS


SAMPLE_YAML = """
a: 1e-5
b: 1.0e-5
c: -2E+3
d: .5
e: 1_000
f: 3
g: 1:30
h: .inf
i: 0x1F
j: yes
k: '1e-5'
l: 1e5
m: 12e
n: +7.
o: .nan
p: [1e-3, 2, x]
q: ~
r: 2024-01-01
s: 1.5e3
"""


def test_yaml_loader_mirrors_mlx_lm():
    ours = yaml.load(SAMPLE_YAML, yaml_loader())
    theirs = yaml.load(SAMPLE_YAML, mlx_lm.lora.yaml_loader)
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key == "o":  # nan != nan
            assert ours[key] != ours[key] and theirs[key] != theirs[key]
            continue
        assert ours[key] == theirs[key] and type(ours[key]) is type(theirs[key]), key
    assert ours["a"] == 1e-5 and ours["l"] == 1e5 and ours["m"] == "12e"


def test_import_stays_light_and_leaves_safeloader_alone():
    code = (
        "import sys, yaml, mlxfit.model.runconfig\n"
        "assert 'mlx_lm' not in sys.modules and 'transformers' not in sys.modules\n"
        "assert yaml.safe_load('a: 1e-5') == {'a': '1e-5'}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def write(tmp_path, text, name="lora.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch_size: four\n", "batch_size must be a whole number, got 'four'"),
        ("batch_size: 4.0\n", "batch_size must be a whole number"),
        ("grad_checkpoint: 1\n", "grad_checkpoint must be true or false"),
        ("max_seq_length: true\n", "max_seq_length must be a whole number"),
        ("lora_parameters: {rank: 8, scale: x, dropout: 0}\n", "lora_parameters.scale must be a number"),
        ("lora_parameters: 8\n", "lora_parameters must be a mapping"),
        ("lora_parameters: {rank: 8, scale: 1, dropout: 0, keys: q_proj}\n", "keys must be a list"),
        ("- batch_size: 4\n", "must be a mapping of options, not a list"),
        ("just text\n", "not a string"),
        ("", "is empty"),
        ("batch_size: 4\nnum_layers: [1\nfoo: 2\n", "not valid YAML"),
        ("fine_tune_type: qlora\n", "unknown fine-tune type 'qlora'"),
        ("batch_size: 0\n", "batch-size must be at least 1"),
        ("model: 7\n", "model must be text"),
    ],
)
def test_bad_files(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        resolve({}, path)
    assert message in str(e.value)
    assert str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_yaml_error_names_the_line(tmp_path):
    path = write(tmp_path, "batch_size: 4\niters: 10\nlora_parameters:\n  rank: [8\n  scale: 2\n")
    with pytest.raises(BadInput, match=r"not valid YAML: .* at line \d+$") as e:
        load_yaml(path)
    assert "line 5" in str(e.value) or "line 4" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(MlxfitError, match="not found"):
        resolve({}, tmp_path / "nope.yaml")


def test_lora_parameters_without_scale_gets_mlx_lm_hint(tmp_path):
    path = write(tmp_path, "lora_parameters: {rank: 8, alpha: 16, dropout: 0.0}\n")
    with pytest.raises(BadInput, match="missing required key 'scale'. Found 'alpha' instead"):
        resolve({}, path)
    # mlx-lm itself fails the same way when it builds the LoRA layers:
    from mlx_lm.tuner.utils import linear_to_lora_layers

    with pytest.raises(KeyError, match="Found 'alpha' instead"):
        linear_to_lora_layers(None, 1, {"rank": 8, "alpha": 16, "dropout": 0.0})
    # ... and full fine-tuning never reads lora_parameters.
    assert resolve({"fine_tune_type": "full"}, path).training.fine_tune_type == "full"


def test_lora_parameters_without_dropout(tmp_path):
    path = write(tmp_path, "lora_parameters: {rank: 8, scale: 20}\n")
    with pytest.raises(BadInput, match="lacks 'dropout'"):
        resolve({}, path)


def test_unknown_lora_subkeys_are_reported(tmp_path):
    path = write(tmp_path, "lora_parameters: {rank: 8, scale: 20, dropout: 0, alpha: 3}\nfoo: 1\n")
    assert resolve({}, path).unknown_keys == ["foo", "lora_parameters.alpha"]


def test_unknown_flag_key_is_a_programming_error():
    with pytest.raises(ValueError):
        resolve({"batchsize": 4})


def test_to_dict_is_json(tmp_path):
    import json

    path = write(tmp_path, "iters: 10\nadapter_path: 2024-01-01\nlr_schedule: {name: x, arguments: [1e-5]}\n")
    out = json.loads(json.dumps(resolve({}, path).to_dict()))
    assert out["config"]["adapter_path"] == {"value": "2024-01-01", "source": "file"}
    assert out["config"]["lr_schedule"]["value"] == {"name": "x", "arguments": [1e-5]}


def test_keys_mlx_lm_takes_only_from_its_parser(tmp_path):
    """main() fills a key from the file only while it is None; these two never are."""
    parsed = vars(mlx_lm.lora.build_parser().parse_args([]))
    from mlxfit.model.runconfig import OVERRIDDEN_BY_PARSER

    assert {k for k in CONFIG_KEYS if parsed.get(k) is not None} == set(OVERRIDDEN_BY_PARSER)
    path = write(tmp_path, "trust_remote_code: true\nclear_cache_threshold: 5\niters: 3\n")
    theirs = mlx_lm_args([], path)
    assert theirs["trust_remote_code"] is False and theirs["clear_cache_threshold"] == 0
    ours = resolve({}, path)
    assert ours.ignored_keys == ["clear_cache_threshold", "trust_remote_code"]
    assert "trust_remote_code" not in ours.other and ours.other == {"iters": 3}
    assert ours.to_dict()["ignored_keys"] == ["clear_cache_threshold", "trust_remote_code"]
