"""The machine's memory in words: the line every report opens with, its warnings, and
`mlxfit memory`'s table."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..machine import Machine
from ..units import format_gb
from .text import console, print_hanging


def machine_fields(machine: Machine) -> list[str]:
    kind = "unified memory" if machine.unified else "GPU memory (system RAM does not count)"
    where = "hypothetical" if machine.hypothetical else machine.backend
    fields = [
        f"{format_gb(machine.total_bytes)} {kind} ({where})",
        f"reserve {format_gb(machine.reserve_bytes)}",
        f"budget {format_gb(machine.usable_bytes)}",
    ]
    if not machine.hypothetical:
        fields.append(f"in use now {format_gb(machine.used_bytes)}")
    return fields


def machine_line(machine: Machine) -> str:
    return " · ".join(machine_fields(machine))


def print_warnings(machine: Machine) -> None:
    for warning in machine.warnings:
        print_hanging(f"[yellow]warning:[/] {warning}", indent=2)


def render_memory(machine: Machine) -> None:
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("backend", machine.backend + (f" ({machine.device_name})" if machine.device_name else ""))
    table.add_row("memory", "unified (shared by CPU and GPU)" if machine.unified else "dedicated GPU memory")
    table.add_row("total", format_gb(machine.total_bytes))
    if not machine.hypothetical:
        table.add_row("in use now", format_gb(machine.used_bytes))
        table.add_row("available now", format_gb(machine.available_bytes))
    table.add_row("reserve (OS and apps)", format_gb(machine.reserve_bytes))
    table.add_row("usable budget", Text(format_gb(machine.usable_bytes), style="bold"))
    if machine.recommended_working_set_bytes:
        table.add_row("Metal recommended working set", format_gb(machine.recommended_working_set_bytes))
    console.print(table)
    print_warnings(machine)
    console.print("[dim]GB = 10^9 bytes[/]")
