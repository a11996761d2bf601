"""The one shared console (and its twin on stderr) and the helpers that lay words out on it:
wrapped lines, fields, the verdicts' colours. Every renderer draws through these."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from ..estimate.verdict import Verdict

# No :emoji: codes: mlxfit writes none, a model id or path is printed as it is, and
# rich's table of emoji names (a few ms to import) is never loaded.
console = Console(highlight=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)

# A Verdict in words and colour, for every renderer: the words are those --json gives.
VERDICT_STYLE = {Verdict.FITS: "green", Verdict.TIGHT: "yellow", Verdict.DOES_NOT_FIT: "bold red",
                 Verdict.CANNOT: "yellow"}
VERDICT_MARK = {Verdict.FITS: "✓", Verdict.TIGHT: "!", Verdict.DOES_NOT_FIT: "✗"}  # fits' table cells


def verdict_of(verdict: Verdict | str) -> Verdict:
    """A Verdict, or its words as an answer's dict carries them."""
    return verdict if isinstance(verdict, Verdict) else Verdict(verdict)


def verdict_markup(verdict: Verdict | str, after: str = "") -> str:
    """The verdict's words in its colour, as markup (`after` inside the colour)."""
    verdict = verdict_of(verdict)
    return f"[{VERDICT_STYLE[verdict]}]{verdict.value}{after}[/]"


def verdict_text(verdict: Verdict | str, after: str = "") -> Text:
    """The same as a Text (a table cell)."""
    verdict = verdict_of(verdict)
    return Text(verdict.value + after, style=VERDICT_STYLE[verdict])


def print_hanging(text, indent: int = 9, out: Console | None = None) -> None:
    """Print text wrapped to the terminal (80 columns piped), later lines indented."""
    out = out or console
    if isinstance(text, str):
        text = Text.from_markup(text, emoji=False)
    width = max(out.width, 40)
    lines = text.wrap(out, width)
    if len(lines) <= 1:
        out.print(text, soft_wrap=True)
        return
    at = len(lines[0].plain)
    while at < len(text.plain) and text.plain[at] == " ":
        at += 1
    first = lines[0]
    first.rstrip()
    out.print(first, soft_wrap=True)
    for line in text[at:].wrap(out, width - indent):
        line.rstrip()
        out.print(Text(" " * indent) + line, soft_wrap=True)


def print_fields(label: str, fields: list, sep: str = " · ", indent: int = 9, out: Console | None = None) -> None:
    """`label` then fields joined by `sep`, broken between fields (never inside one)
    to fit the terminal, continuation lines indented under the first field."""
    out = out or console
    width = max(out.width, 40)
    line = Text()
    line.append(label, style="bold")
    line.append(" " * max(indent - len(label), 1 if label else 0))
    for i, field in enumerate(fields):
        piece = Text.from_markup(field, emoji=False) if isinstance(field, str) else field
        last = i == len(fields) - 1
        if i and len(line.plain) + len(sep) + len(piece.plain) + (0 if last else len(sep.rstrip())) > width:
            line.append(sep.rstrip())
            _print_line(line, indent, width, out)
            line = Text(" " * indent) + piece
        else:
            line = (line + Text(sep) + piece) if i else (line + piece)
    _print_line(line, indent, width, out)


def _print_line(line: Text, indent: int, width: int, out: Console) -> None:
    """One line of fields; a field wider than the terminal is wrapped between its words."""
    if len(line.plain) <= width:
        out.print(line, soft_wrap=True)
        return
    print_hanging(line, indent=indent, out=out)


def tokens(n: int) -> str:
    return f"{n:,} token{'s' if n != 1 else ''}"


def table_fits(table, out: Console | None = None) -> bool:
    """Whether a rich table fits the terminal with no cell cut: each column at least as
    wide as its longest word (rich wraps cells between words, and cuts only below that)."""
    from rich.measure import Measurement

    out = out or console
    unbounded = out.options.update_width(10_000)  # measured at the terminal's width, a table shrinks to fit it
    return Measurement.get(out, unbounded, table).minimum <= out.width


def print_table(table, out: Console | None = None) -> None:
    """A table where it fits the terminal; narrower, each row on lines of its own (its
    first cell, then each other cell after its header), wrapped between words, so that
    a narrow terminal never cuts a number."""
    out = out or console
    if table_fits(table, out):
        out.print(table)
        return
    if table.title:
        print_hanging(Text(str(table.title)), indent=0, out=out)
    columns = table.columns
    for row in zip(*(list(c.cells) for c in columns)):
        line = Text()
        for i, (column, cell) in enumerate(zip(columns, row)):
            piece = Text.from_markup(cell, emoji=False) if isinstance(cell, str) else cell.copy()
            if not piece.plain:
                continue
            if i:
                line.append(" · ")
                header = str(column.header)
                if header:
                    line.append(f"{header} ", style="dim")
            line.append_text(piece)
        print_hanging(line, indent=4, out=out)
