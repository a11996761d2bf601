"""The README and docs/ say what the program does: every mlxfit command they show
parses against the real click commands (commands, flags and values that exist),
every relative link leads to a file of the repository, and the README stays a
short page. Every command's --help carries an example, which parses too."""

import re
import shlex
from pathlib import Path

import click
import pytest

from mlxfit.cli.main import cli

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console", "zsh"}
FENCE = re.compile(r"^```(\w*)\s*$")


def shown_commands(text: str) -> list[str]:
    """The shell lines of a page that run mlxfit: every line of a bash/sh/console
    block, the `$ ` lines of any other fenced block (an output shown with the
    command that made it), and inline code that begins with `mlxfit `."""
    lines, prose, block, joined = [], [], None, ""
    for line in text.splitlines():
        fence = FENCE.match(line.strip())
        if fence:
            block = None if block is not None else fence.group(1)
            continue
        if block is None:
            prose.append(line)
            continue
        if block not in SHELL:
            if not line.startswith("$ "):
                continue
        line = line.removeprefix("$ ")
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        lines.append(joined + line)
        joined = ""
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", "\n".join(prose)))
    lines += [span for span in spans if span.startswith("mlxfit ")]
    return [line for line in lines if "mlxfit" in line]


def invocations(line: str) -> list[list[str]]:
    """Each mlxfit call on a shell line, as its arguments (up to the next
    `&&`, `|`, `;` or redirection)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    calls = []
    for i, token in enumerate(tokens):
        if Path(token).name == "mlxfit" and (i == 0 or not tokens[i - 1].startswith("-")):
            args = []
            for arg in tokens[i + 1:]:
                if arg and set(arg) <= set("&|;<>"):
                    break
                args.append(arg)
            calls.append(args)
    return calls


def check_parses(args: list[str]) -> None:
    """Parse the arguments as mlxfit would, down to the subcommand, without
    running it: an unknown command, flag or choice, or a bad size, fails."""
    name, *rest = args
    if name in ("--version", "--help", "-h"):
        return
    group_ctx = click.Context(cli, info_name="mlxfit", **cli.context_settings)
    command = cli.get_command(group_ctx, name)
    assert command is not None, f"mlxfit {name}: no such command"
    if "--help" in rest or "-h" in rest:
        return
    command.make_context(name, rest, parent=group_ctx)


def all_shown():
    found = []
    for page in PAGES:
        for line in shown_commands(page.read_text()):
            for args in invocations(line):
                found.append(pytest.param(args, id=f"{page.name}: mlxfit {' '.join(args)}"[:120]))
    return found


def test_the_pages_show_mlxfit_commands():
    assert len(all_shown()) >= 10
    assert (ROOT / "docs").is_dir()


@pytest.mark.parametrize("args", all_shown())
def test_every_shown_command_parses(args):
    assert "…" not in " ".join(args), "write the command out in full"
    if not args:
        return  # bare `mlxfit` shows the group's help
    try:
        check_parses(args)
    except click.UsageError as e:
        pytest.fail(f"mlxfit {' '.join(args)}: {e.format_message()}")


def test_the_parser_catches_what_does_not_exist():
    for bad in (["probe", "--no-such-flag"], ["probe", "--method", "qdora"], ["fits", "--memory", "lots"], ["nosuch"]):
        with pytest.raises((click.UsageError, AssertionError)):
            check_parses(bad)
    assert invocations("LD_PRELOAD=x .venv/bin/mlxfit probe -m 7B | cat  # note") == [["probe", "-m", "7B"]]


def test_readme_is_a_short_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.exists(), f"{page.name} links to {target}, which is not in the repository"


def test_pages_name_no_path_outside_the_repository():
    for page in PAGES:
        assert "../shared" not in page.read_text(), page.name


def commands():
    ctx = click.Context(cli)
    return [(name, cli.get_command(ctx, name)) for name in cli.list_commands(ctx)]


@pytest.mark.parametrize("name, command", commands(), ids=[n for n, _ in commands()])
def test_every_command_help_has_an_example_that_parses(name, command):
    help_text = command.get_help(click.Context(command, info_name=name, parent=click.Context(cli, info_name="mlxfit", **cli.context_settings)))
    assert "Example" in help_text, f"mlxfit {name} --help shows no example"
    examples = [line.strip() for line in help_text.splitlines() if line.strip().startswith(f"mlxfit {name}")]
    assert examples, f"mlxfit {name} --help shows no example of itself"
    for line in examples:
        for args in invocations(line):
            check_parses(args)



def shown_answers():
    """Each `$ mlxfit probe ... --memory ...` block with its output, on any page: an
    answer for a hypothetical machine, so the same on every machine (a --measure
    run's output is this machine's and is not compared)."""
    found = []
    for page in PAGES:
        for command, shown in re.findall(r"```text\n\$ (mlxfit probe [^\n]*)\n(.*?)```", page.read_text(), re.S):
            if "--memory" in command and "--measure" not in command:
                found.append(pytest.param(command, shown, id=f"{page.name}: {command}"))
    return found


def test_the_readme_shows_an_answer():
    assert any(p.id.startswith("README.md") for p in shown_answers())


@pytest.mark.parametrize("command, shown", shown_answers())
def test_a_shown_answer_is_what_probe_prints(command, shown, tmp_path):
    """The pages show the program's own output, piped (plain glyphs, 80 columns),
    uncalibrated. When probe's text changes, `python tests/test_docs.py` rewrites
    these blocks with what it prints now."""
    assert probe_prints(command, tmp_path) == shown


def probe_prints(command: str, cache: Path) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "MLXFIT_CACHE_DIR": str(cache), "COLUMNS": "80", "HF_HUB_OFFLINE": "1"}
    env.pop("NO_COLOR", None)
    printed = subprocess.run([sys.executable, "-m", "mlxfit", *shlex.split(command)[1:]], env=env,
                             capture_output=True, text=True, timeout=300)
    assert printed.returncode == 0, printed.stderr
    return "".join(line.rstrip() + "\n" for line in printed.stdout.splitlines())


if __name__ == "__main__":  # rewrite every shown answer with what probe prints now
    import tempfile

    for page in PAGES:
        text = page.read_text()

        def fresh(m):
            command = m.group(1)
            if "--memory" not in command or "--measure" in command:
                return m.group(0)
            return f"```text\n$ {command}\n{probe_prints(command, Path(tempfile.mkdtemp()))}```"

        new = re.sub(r"```text\n\$ (mlxfit probe [^\n]*)\n(.*?)```", fresh, text, flags=re.S)
        if new != text:
            page.write_text(new)
            print("rewrote", page.relative_to(ROOT))


def test_the_groups_help_examples_parse():
    help_text = cli.get_help(click.Context(cli, info_name="mlxfit", **cli.context_settings))
    examples = help_text.split("Examples:")[1].split("Options:")[0].split("\n")
    examples = [line.strip() for line in examples if line.strip().startswith("mlxfit ")]
    assert len(examples) >= 3
    for line in examples:
        for args in invocations(line):
            check_parses(args)
