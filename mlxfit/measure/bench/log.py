"""bench's rows and their CSV log: one combination's outcome, the columns, rows appended
one at a time and read back for --resume (a file of results, not terminal output)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from ...errors import MlxfitError
from ...files import read_text
from ...model.training import TrainingConfig

# On and off in the words --grad-checkpoint takes; a CSV row's on/off is read back by it too.
_ON = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}

# The CSV: the configuration columns identify a run (what --resume matches on).
CONFIG_COLUMNS = (
    "model", "method", "fine_tune_type", "num_layers", "batch_size", "max_seq_length",
    "rank", "grad_checkpoint", "optimizer", "bits", "group_size",
)
RESULT_COLUMNS = (
    "status", "backend", "predicted_bytes", "usable_bytes", "measured_peak_bytes", "steps_peak_bytes",
    "process_peak_bytes", "cache_bytes", "error_pct", "tokens_per_second", "seconds_per_step",
    "steps", "wall_seconds", "measured_by", "reason",
)
COLUMNS = CONFIG_COLUMNS + RESULT_COLUMNS

MEASURED, FAILED, SKIPPED, ESTIMATED = "measured", "failed", "skipped", "estimated"
UNKNOWN = "unknown"  # the measurement timed out: neither fits nor does not fit
FINAL = (MEASURED, FAILED)  # a stored row with one of these is never run again (an unknown one is)
# Exit status of a sweep or --max with a timed-out measurement whose answer is unknown.
EXIT_UNKNOWN = 3


def _config(model_id: str, training: TrainingConfig) -> dict:
    return {
        "model": model_id,
        "method": training.method,
        "fine_tune_type": training.fine_tune_type,
        "num_layers": training.num_layers,
        "batch_size": training.batch_size,
        "max_seq_length": training.max_seq_length,
        "rank": training.rank,
        "grad_checkpoint": training.grad_checkpoint,
        "optimizer": training.optimizer,
        "bits": training.bits,
        "group_size": training.group_size,
    }


def config_key(model_id: str, training: TrainingConfig) -> tuple:
    return tuple(_config(model_id, training).values())


@dataclass(frozen=True)
class Row:
    """One combination's outcome. Bytes as integers; None where not measured."""

    columns = COLUMNS  # of its CSV log (a class attribute, not a field)

    model: str
    training: TrainingConfig
    status: str  # measured | failed | skipped | estimated
    backend: str
    predicted_bytes: int
    usable_bytes: int
    measured_peak_bytes: int | None = None  # peak_with_load_bytes: what mlx-lm's trainer reports
    steps_peak_bytes: int | None = None  # MLX's peak over the steps alone
    process_peak_bytes: int | None = None
    cache_bytes: int | None = None
    tokens_per_second: float | None = None
    seconds_per_step: float | None = None  # mean over the steps after the first (compile)
    steps: int | None = None
    wall_seconds: float | None = None  # the whole measurement: start, build, steps
    measured_by: str | None = None  # "full", or "slice": over what this machine can hold (mlxfit/measure/slicing.py)
    reason: str = ""
    estimate_range_bytes: tuple[int, int] | None = None  # probe's range of the estimate (not a CSV column)

    @property
    def key(self) -> tuple:
        return config_key(self.model, self.training)

    @property
    def error_pct(self) -> float | None:
        """Positive: the prediction was above the measured peak (the safe side)."""
        if not self.measured_peak_bytes:
            return None
        return round(100.0 * (self.predicted_bytes - self.measured_peak_bytes) / self.measured_peak_bytes, 2)

    @property
    def measured_fits(self) -> bool | None:
        return None if self.measured_peak_bytes is None else self.measured_peak_bytes <= self.usable_bytes

    def to_dict(self) -> dict:
        data = _config(self.model, self.training)
        data.update({name: getattr(self, name) for name in RESULT_COLUMNS})
        data["measured_fits"] = self.measured_fits
        data["training"] = self.training.to_dict()
        return data

    def to_csv(self) -> dict:
        out = {}
        for name, value in self.to_dict().items():
            if name not in self.columns:
                continue
            if isinstance(value, bool):
                value = "on" if value else "off"
            out[name] = "" if value is None else value
        return out

    @classmethod
    def from_csv(cls, record: dict) -> "Row":
        """A row read back from the log; raises ValueError or KeyError if it is damaged."""

        def number(name, kind):
            text = (record.get(name) or "").strip()
            return kind(text) if text else None

        method = record["method"]
        training = TrainingConfig(
            fine_tune_type=record["fine_tune_type"],
            num_layers=int(record["num_layers"]),
            batch_size=int(record["batch_size"]),
            max_seq_length=int(record["max_seq_length"]),
            rank=int(record["rank"]),
            grad_checkpoint=_ON[record["grad_checkpoint"].strip().lower()],
            optimizer=record["optimizer"],
            bits=int(record["bits"]),
            group_size=int(record["group_size"]),
            quantize=(method == "qlora"),
        )
        return cls(
            model=record["model"],
            training=training,
            status=record["status"],
            backend=record["backend"],
            predicted_bytes=int(record["predicted_bytes"]),
            usable_bytes=int(record["usable_bytes"]),
            measured_peak_bytes=number("measured_peak_bytes", int),
            steps_peak_bytes=number("steps_peak_bytes", int),
            process_peak_bytes=number("process_peak_bytes", int),
            cache_bytes=number("cache_bytes", int),
            tokens_per_second=number("tokens_per_second", float),
            seconds_per_step=number("seconds_per_step", float),
            steps=number("steps", int),
            wall_seconds=number("wall_seconds", float),
            measured_by=record.get("measured_by") or None,
            reason=record.get("reason") or "",
        )


class CsvLog:
    """Rows appended to a CSV file and flushed one at a time; the header written once.

    A sweep that is killed keeps every row written before; a row cut off halfway
    is ignored when the file is read back, and the next row starts on a new line.
    """

    def __init__(self, path, row=Row):
        self.path = Path(path)
        self.row = row  # Row, or a kind with more columns (preference.PreferenceRow)
        self.columns = row.columns

    def _text(self) -> str:
        """The log as text; one line naming it if it cannot be read or is not UTF-8 text."""
        return read_text(self.path, "--out file")

    def _header(self) -> list[str] | None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        return next(csv.reader(io.StringIO(self._text(), newline="")), None)

    def check(self) -> None:
        header = self._header()
        if header is not None and tuple(header) != self.columns:
            # A log of the other kind of sweep is named as such: SFT rows and
            # mlx-lm-lora's are kept in files of their own.
            kind = (": a bench --train-mode dpo/cpo/orpo/grpo log" if "train_mode" in header
                    else ": a bench log of sft runs" if tuple(header) == COLUMNS else "")
            raise MlxfitError(
                f"{self.path} was written with other columns ({len(header)} instead of {len(self.columns)}{kind}); "
                "give --out another file"
            )

    def read(self) -> list[Row]:
        self.check()
        if self._header() is None:
            return []
        rows = []
        for record in csv.DictReader(io.StringIO(self._text(), newline="")):
            try:
                rows.append(self.row.from_csv(record))
            except (ValueError, KeyError, TypeError, AttributeError, MlxfitError):
                continue  # a row cut off by a kill, or edited by hand
        return rows

    def append(self, row: Row) -> None:
        """Add one row. The file is written anew beside itself and renamed over
        (mlxfit/files.py), so a full disk leaves the rows before it whole."""
        from ...files import write_atomically

        self.check()
        before = b"" if self._header() is None else self.path.read_bytes()
        text = io.StringIO(newline="")
        if before and not before.endswith(b"\n"):
            text.write("\n")
        writer = csv.DictWriter(text, fieldnames=self.columns)
        if not before:
            writer.writeheader()
        writer.writerow(row.to_csv())
        write_atomically(self.path, lambda f: f.write(before + text.getvalue().encode()))
