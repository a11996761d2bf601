"""The Python API (docs/python-api.md): the command line's probe is its client, so the
two give the same answer, and the page's examples run."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import mlxfit
from mlxfit.cli.main import cli
from mlxfit.errors import BadInput
from conftest import LINUX_CPU

PAGE = Path(__file__).parent.parent / "docs" / "python-api.md"


def cli_json(*args) -> str:
    result = CliRunner().invoke(cli, ["probe", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_pages_examples_run(platform, capsys):
    platform(LINUX_CPU)
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 4
    for block in blocks:
        exec(compile(block, str(PAGE), "exec"), {})
    assert "--max-seq-length 100,000 is past Qwen/Qwen3-0.6B's context" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["sft", "dpo"])
def test_the_api_gives_the_bytes_of_probe_json(platform, mode):
    platform(LINUX_CPU)
    answer = mlxfit.probe("Qwen/Qwen3-0.6B", train_mode=mode, memory="16GB", batch_size=1, max_seq_length=1024)
    shown = cli_json("Qwen/Qwen3-0.6B", "--train-mode", mode, "--memory", "16GB", "--batch-size", "1",
                     "--max-seq-length", "1024")
    assert json.dumps(answer.to_dict(), indent=2) + "\n" == shown


def test_training_settings_given_partially_are_merged_with_the_defaults(platform):
    """answer.probe with a partial dict raised KeyError: 'mask_prompt'."""
    from mlxfit import answer

    platform(LINUX_CPU)
    given = answer.probe("Qwen/Qwen3-0.6B", {"batch_size": 1, "max_seq_length": 1024}, memory=16 * 10**9)
    training = given.to_dict()["training"]
    assert (training["batch_size"], training["max_seq_length"], training["rank"]) == (1, 1024, 8)
    assert given.to_dict() == mlxfit.probe("Qwen/Qwen3-0.6B", memory=16 * 10**9, batch_size=1,
                                           max_seq_length=1024).to_dict()


def test_estimate_run_is_the_rows_estimate():
    plan = mlxfit.plan("Qwen/Qwen3-0.6B", memory="16GB", batch_size=1, max_seq_length=1024, backend="cpu")
    needs = mlxfit.estimate_run("Qwen/Qwen3-0.6B", batch_size=1, max_seq_length=1024, backend="cpu")
    assert plan.selected.predicted_bytes == needs.peak_bytes


def test_an_unknown_setting_is_refused_in_one_line():
    with pytest.raises(BadInput, match="unknown training setting 'batch'"):
        mlxfit.plan("Qwen/Qwen3-0.6B", batch=4)


def test_import_mlxfit_imports_no_estimate():
    code = "import sys, mlxfit; print(sorted(m for m in sys.modules if m.startswith('mlxfit.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# Where mlxfit outside its command line (mlxfit/cli/) reads or sets the environment, and why:
# anything else is the caller's to pass.
ENVIRONMENT_READERS = {
    "cache.py",  # where mlxfit keeps what it remembers: MLXFIT_CACHE_DIR, else XDG_CACHE_HOME
    "measure/lifeline.py",  # the measuring child finds its parent's temporary folder in its environment
    "measure/parent.py",  # the measuring child's environment: the parent's, with the child's folder added
    "model/transformers_notices.py",  # transformers' notices kept off the output (setdefault, a user's value kept)
}


def test_the_environment_is_read_only_in_the_command_line_and_where_listed():
    """An estimate is told what to use (`miniatures=` for MLXFIT_MINIATURES, read in
    mlxfit/cli/options.py), never reads a switch deep inside."""
    import ast

    package = Path(mlxfit.__file__).parent
    readers = set()
    for path in package.rglob("*.py"):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            reads = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                     and node.attr in ("environ", "environb", "getenv", "putenv", "unsetenv"))
            imports = (isinstance(node, ast.ImportFrom) and node.module == "os"
                       and any(a.name in ("environ", "environb", "getenv") for a in node.names))
            if reads or imports:
                readers.add(relative)
    assert readers == set(ENVIRONMENT_READERS)
