"""Several Macs under mlx.launch: read its JSON hostfile and check each node.

mlx.launch's hostfile is a list of hosts (or {"hosts": [...]}) with "ssh" and
"ips" (mlx/_distributed_utils/common.py: Hostfile.from_file). mlxfit reads one
more key per host, "memory" ("36GB"), which mlx.launch ignores.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput, MlxfitError
from ..files import read_text
from ..machine import Machine, PlatformReadings, build_machine
from ..units import parse_bytes
from .verdict import judge


@dataclass(frozen=True)
class Host:
    name: str
    machine: Machine

    def check(self, per_node_bytes: int, range_bytes: tuple[int, int]) -> dict:
        """`range_bytes`: the estimate's [low, high] (the rule of thumb's too), judged
        against this host's budget."""
        usable = self.machine.usable_bytes
        verdict = judge(*range_bytes, usable)
        return {
            "host": self.name,
            "total_bytes": self.machine.total_bytes,
            "usable_bytes": usable,
            "predicted_peak_bytes": per_node_bytes,
            "predicted_range_bytes": list(range_bytes),
            "fits": verdict.fits,
            "verdict": verdict.value,
        }


def read_hostfile(path: Path, readings: PlatformReadings, reserve=None) -> list[Host]:
    text = read_text(path, "hostfile")  # one line for a binary file or another encoding
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MlxfitError(f"hostfile {path} is not valid JSON: {e.msg.removesuffix(' at')} at line {e.lineno}") from e
    entries = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise MlxfitError(f"hostfile {path} lists no hosts")
    hosts = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "ssh" not in entry:
            raise MlxfitError(f"hostfile {path}: host {i} has no 'ssh' name")
        if "memory" not in entry:
            raise MlxfitError(f"hostfile {path}: host {entry['ssh']!r} has no 'memory' (e.g. \"memory\": \"36GB\")")
        try:
            memory = parse_bytes(str(entry["memory"]))
        except BadInput as e:
            raise MlxfitError(f"hostfile {path}: host {entry['ssh']!r}: {e}") from e
        hosts.append(Host(entry["ssh"], build_machine(readings, reserve=reserve, memory=memory)))
    return hosts


def smallest(hosts: list[Host]) -> Host:
    """Every node holds the whole model: the one with the least budget decides."""
    return min(hosts, key=lambda h: h.machine.usable_bytes)
