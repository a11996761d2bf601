"""The command line parses, calls and renders: no function in mlxfit/cli/ is over 40
lines (decorators excluded), so each command reads as a short list of steps."""

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parent.parent / "mlxfit" / "cli"
LONGEST = 40


def test_no_cli_function_is_over_40_lines():
    long = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # from `def`: decorators excluded
                if lines > LONGEST:
                    long.append(f"{path.name}:{node.name} ({lines} lines)")
    assert not long, "split these into helpers: " + ", ".join(long)
