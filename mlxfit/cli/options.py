"""Options and helpers shared by every command (mlxfit/cli/main.py, mlxfit/cli/bench.py)."""

from __future__ import annotations

import functools
import os

import click

from ..answer import get_machine, local_calibration, local_usable_bytes  # noqa: F401  (shared by every command)
from ..errors import MlxfitError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def given_flag(ctx, name: str) -> bool:
    """Did the user give this option (on the command line), rather than leave its default?"""
    return ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT


class SizeParam(click.ParamType):
    """A machine's memory: under a megabyte is a slip of the unit (1B is a byte, not a
    billion), not a machine."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        from ..units import parse_bytes

        if isinstance(value, int):
            return value
        try:
            size = parse_bytes(value)
        except MlxfitError as e:
            self.fail(str(e), param, ctx)
        if size < 10**6:
            self.fail(f"{value!r} is {size:,} byte{'' if size == 1 else 's'}, under 1 MB: give the unit, e.g. 16GB or 16GiB", param, ctx)
        return size


class ReserveParam(click.ParamType):
    name = "FRACTION|SIZE"

    def convert(self, value, param, ctx):
        from ..machine import parse_reserve

        try:
            return parse_reserve(value)
        except MlxfitError as e:
            self.fail(str(e), param, ctx)


def _output_lost() -> bool:
    """Whether stdout itself cannot be written (a full disk, a closed pipe); then it
    is pointed at /dev/null, so that Python's own flush at exit fails no more."""
    import sys

    try:
        sys.stdout.flush()
        return False
    except (OSError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return True


def debugging() -> bool:
    """MLXFIT_DEBUG set to a true value (1, true, yes): errors show their traceback.
    0, false, no or empty leave them one line."""
    return os.environ.get("MLXFIT_DEBUG", "").strip().lower() in ("1", "true", "yes")


MINIATURES = "MLXFIT_MINIATURES"


def miniatures() -> bool:
    """Whether DPO, CPO and ORPO may count their logits buffers on miniatures of the
    model (mlxfit/measure/miniature.py); MLXFIT_MINIATURES=0: the fitted count, no child
    process. Read here only: the estimate is told, never reads the environment."""
    return os.environ.get(MINIATURES, "1") != "0"


def handle_errors(fn):
    """Library errors become one line and an exit status; Ctrl-C exits 130; a file
    or the output that cannot be written, one line and exit status 1;
    MLXFIT_DEBUG=1 (true, yes) re-raises."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            _output_lost()  # `| head`: the reader has what it wanted
            click.get_current_context().exit(1)
        except OSError as e:
            if debugging():
                raise
            click.echo(f"Error: {_os_error_words(e)}", err=True)
            click.get_current_context().exit(1)
        except KeyboardInterrupt as e:
            if debugging():
                raise
            click.echo("Interrupted.", err=True)
            # 128 + the signal's number, as shells report it (SIGINT unless a watch saw another)
            click.get_current_context().exit(getattr(e, "exit_code", 130))
        except MlxfitError as e:
            if debugging():
                raise
            if e.exit_code == 2:
                raise click.UsageError(str(e)) from None
            if e.exit_code != 1:  # 130: interrupted
                click.echo(f"Error: {e}", err=True)
                click.get_current_context().exit(e.exit_code)
            raise click.ClickException(str(e)) from None

    return wrapper


def _os_error_words(e: OSError) -> str:
    """An OSError in one line: the output's (a write error naming no file, as a full disk
    under `> file` gives) or the file's."""
    import errno

    if _output_lost() or (e.filename is None and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)):
        return f"cannot write the output: {e.strerror or e}"
    return f"{e.filename}: {e.strerror or e}" if e.filename else str(e)


def machine_options(fn):
    options = [
        click.option("--memory", type=SizeParam(), help="Plan for a hypothetical unified-memory machine of this size instead of this one (36GB, 36GiB, 512MB)."),
        click.option("--gpu-memory", type=SizeParam(), help="Plan for a hypothetical discrete GPU with this much memory (the computer's RAM does not count)."),
        click.option("--reserve", type=ReserveParam(), help="Memory kept back for the OS and apps: a fraction (0.25, 25%) or a size (8GB). Default: a quarter of unified memory, 5% of a GPU's."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def json_option(fn):
    return click.option("json_", "--json", is_flag=True, help="Print one JSON object (bytes as integers) instead of text.")(fn)


def print_json(data: dict) -> None:
    """JSON on stdout (bytes as integers), without loading the text renderer."""
    import json

    click.echo(json.dumps(data, indent=2))
