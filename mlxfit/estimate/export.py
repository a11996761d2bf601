"""This machine's stored measurements as rows of the public evidence (benchmarks/evidence/).

`mlxfit calibration --export FILE` writes each `--measure` result stored on this machine
(mlxfit/estimate/calibration.py) as one CSV row: the columns of mac_runs.csv, so a row
reads like the public runs beside it, then the machine-readable columns
benchmarks/mac_evidence.py needs to reproduce it (EXTRA_COLUMNS), and the measured pace
(tokens a step, tokens per second and seconds a step after the first, on the machine the
`chip` column names: mac_throughput.csv's columns, so a row is evidence for the chip
table of time.md too; empty for a slice, whose pace is not the run's). A row never holds a
path on the user's machine: a local model (a folder, absolute or relative) is named by its
architecture and carried by its config.json (keys naming files or folders dropped).
"""

from __future__ import annotations

import json
import os
import re
from datetime import date

GB = 10**9
EVIDENCE_COLUMNS = ("source_url_or_ref", "date", "model_id", "method", "batch_size", "seq_len", "num_layers", "rank",
                    "lora_keys", "grad_checkpoint", "peak_gb", "chip", "mlx_lm_version", "iters_before_peak_report",
                    "notes", "trust")
EXTRA_COLUMNS = ("backend", "mlx_version", "memory_gb", "widest_batch", "predicted_gb", "slice", "training", "config",
                 "tokens_per_step", "tokens_per_sec", "step_seconds")
COLUMNS = EVIDENCE_COLUMNS + EXTRA_COLUMNS
SOURCE = "mlxfit --measure (contributed)"


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def is_local(model_id: str, source: str | None = None) -> bool:
    """A model given as a folder, absolute or relative, rather than a Hub or catalog id.
    `source` is stored with measurements since it was recorded; before, a folder is
    anything that is not shaped as a Hub id (owner/name) or that is a folder here."""
    if source is not None:
        return source == "local"
    return (model_id.startswith(("/", "~", ".")) or "\\" in model_id or not _HUB_ID.fullmatch(model_id)
            or os.path.isdir(os.path.expanduser(model_id)))


def _looks_like_path(value) -> bool:
    return isinstance(value, str) and (value.startswith(("/", "~", "./", "../")) or ":\\" in value)


def clean_config(config: dict) -> dict:
    """config.json without what could name a place on the user's machine."""
    out = {}
    for key, value in config.items():
        if key in ("_name_or_path", "name_or_path") or _looks_like_path(value):
            continue
        out[key] = clean_config(value) if isinstance(value, dict) else value
    return out


def model_name(entry: dict) -> str:
    model = entry.get("model") or ""
    if not is_local(model, entry.get("source")) and not entry.get("config"):  # a config is stored for folders only
        return model
    arch = entry.get("architecture") or {}
    return f"local {arch.get('model_type') or 'model'} ({arch.get('params') or '?'} parameters, {arch.get('dtype') or '?'})"


def evidence_row(entry: dict, machine: dict) -> dict:
    """One stored measurement as an evidence row. `machine`: device_name and total_bytes of
    the machine it was measured on (stored with the measurement since it was recorded; this
    machine's otherwise)."""
    t = entry.get("training") or {}
    measured = entry.get("measured") or {}
    versions = entry.get("versions") or {}
    machine = entry.get("machine") or machine
    arch = entry.get("architecture") or {}
    quantized = t.get("quantize") or arch.get("bits") not in (None, 16, 32)
    method = t.get("fine_tune_type", "lora")
    if quantized and method != "full":
        method = "q" + method
    width = entry.get("length") or t.get("max_seq_length")
    keys = t.get("lora_keys")
    peak = measured.get("peak_with_load_bytes") or 0
    config = entry.get("config")
    pace = entry.get("time") or {}
    whole = measured.get("slice") is None
    tokens_per_sec = pace.get("tokens_per_second") or measured.get("tokens_per_second") if whole else None
    return {
        "source_url_or_ref": SOURCE,
        "date": entry.get("date") or date.today().isoformat(),
        "model_id": model_name(entry),
        "method": method,
        "batch_size": t.get("batch_size"),
        "seq_len": f"{width} (every batch {width} wide: mlxfit's measurement)",
        "num_layers": t.get("num_layers"),
        "rank": t.get("rank"),
        "lora_keys": "all linear" if keys is None else ",".join(keys),
        "grad_checkpoint": "yes" if t.get("grad_checkpoint") else "no",
        "peak_gb": f"{peak / GB:.3f}",
        "chip": machine.get("device_name") or "",
        "mlx_lm_version": versions.get("mlx-lm") or "",
        "iters_before_peak_report": measured.get("steps") or "",
        "notes": (f"mx.get_peak_memory() with the model's load, over {measured.get('steps') or '?'} steps of "
                  f"{t.get('batch_size')} x {width} tokens; mlxfit's estimate {entry.get('predicted_peak_bytes', 0) / GB:.3f} GB"
                  + ("; extrapolated from slices of the model" if measured.get("slice") is not None else "")),
        "trust": "high",
        "backend": entry.get("backend") or "",
        "mlx_version": versions.get("mlx") or "",
        "memory_gb": f"{machine.get('total_bytes', 0) / GB:.1f}" if machine.get("total_bytes") else "",
        "widest_batch": width,
        "predicted_gb": f"{entry.get('predicted_peak_bytes', 0) / GB:.3f}",
        "slice": "yes" if measured.get("slice") is not None else "no",
        "training": json.dumps(t, sort_keys=True),
        "config": json.dumps(clean_config(config), sort_keys=True) if config else "",
        "tokens_per_step": (t.get("batch_size") or 0) * (width or 0) or "",
        "tokens_per_sec": f"{tokens_per_sec:.1f}" if tokens_per_sec else "",
        "step_seconds": f"{pace['step_seconds']:.4f}" if whole and pace.get("step_seconds") else "",
    }


def write(path, entries: list[dict], machine: dict) -> int:
    """Write the rows; returns how many."""
    import csv

    rows = [evidence_row(e, machine) for e in entries]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
