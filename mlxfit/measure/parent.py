"""Run a few real mlx-lm training steps in a child process and report the peak.

The child (mlxfit/measure/child.py) does the work; this side starts it, shows progress,
enforces the timeout, stops it on Ctrl-C, and turns a crash or an out-of-memory
kill into a report. Nothing is written outside a temporary directory.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import MlxfitError
from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from ..units import format_gb

DEFAULT_MAX_STEPS = 6


class MeasurementFailed(MlxfitError):
    """The run died; the message says where and after how much memory.

    `kind`: "timeout" (stopped by --timeout: whether it fits is unknown),
    "interrupted" (Ctrl-C), "refused" (not run: it cannot be measured here), or
    "died" (out of memory, a crash, bad input)."""

    def __init__(self, message: str, kind: str = "died"):
        super().__init__(message)
        self.kind = kind

    @property
    def unknown(self) -> bool:
        """Nothing was learnt about whether the run fits."""
        return self.kind in ("timeout", "interrupted", "refused")


class MeasurementInterrupted(MeasurementFailed):
    """Ctrl-C stopped the measurement: exit status 130, as for any interrupted command
    (128 + the signal's number for another signal, see InterruptWatch)."""

    exit_code = 130


class InterruptWatch:
    """Every signal that ends a measuring command must stop its child first.

    While it is entered, SIGINT (even where it was inherited ignored, as by a job
    started in the background from a script, so that Ctrl-C works however the
    command was started), SIGTERM (`kill`, `timeout`) and SIGHUP (the terminal
    closed; left alone where it was inherited ignored, as under nohup) raise
    KeyboardInterrupt, which run_child turns into stopping its child, removing its
    temporary folder and raising MeasurementInterrupted. `signum` is the signal
    that came (None: none). Outside the main thread it watches nothing.
    """

    def __init__(self):
        self.signum = None
        self._previous = {}

    @property
    def seen(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """As a shell reports a command ended by the signal: 128 + its number."""
        return 128 + (self.signum or signal.SIGINT)

    def _handler(self, signum, frame):
        self.signum = signum
        raise KeyboardInterrupt

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                    continue  # nohup: a hangup is not meant to end it
                self._previous[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)


class Interrupted(KeyboardInterrupt):
    """A signal ended a sweep between or during measurements, its child already
    stopped: the command exits as the shell reports that signal."""

    def __init__(self, exit_code: int = 130):
        super().__init__()
        self.exit_code = exit_code


@contextmanager
def stopping_children():
    """Every child started inside (a measurement, the miniatures) is stopped, and its
    folder removed, by whichever signal ends the command; the command then exits
    with 128 + that signal's number (MeasurementInterrupted.exit_code)."""
    with InterruptWatch() as watch:
        try:
            yield watch
        except MeasurementInterrupted as e:
            e.exit_code = watch.exit_code
            raise


@dataclass(frozen=True)
class Measurement:
    peak_bytes: int  # mx.get_peak_memory() over the steps, reset after the build
    peak_with_load_bytes: int  # the same, not reset: what mlx-lm's trainer reports
    load_peak_bytes: int  # mx.get_peak_memory() while the model was built (loaded)
    cache_bytes: int  # mx.get_cache_memory() after the steps
    process_peak_bytes: int  # the process's resident high-water mark
    steps: int
    seconds: float
    build_seconds: float
    backend: str
    step_peaks_bytes: tuple[int, ...] = field(default=())
    step_seconds: tuple[float, ...] = field(default=())
    tokens_per_step: int = 0
    ranks: tuple[dict, ...] = field(default=())  # every rank's peaks under mlx.launch
    method: str = "full"  # "full", or "slice": the peaks extrapolated from slices (mlxfit/measure/slicing.py)
    slice: dict | None = None  # what the slices were and measured

    @property
    def occupied_bytes(self) -> int:
        """What really held memory: the larger of MLX's peak and the process's."""
        return max(self.peak_with_load_bytes, self.process_peak_bytes)

    @property
    def tokens_per_second(self) -> float:
        steady = self.step_seconds[1:] or self.step_seconds
        return self.tokens_per_step * len(steady) / sum(steady) if steady and sum(steady) else 0.0

    def to_dict(self) -> dict:
        return {
            "peak_bytes": self.peak_bytes,
            "peak_with_load_bytes": self.peak_with_load_bytes,
            "load_peak_bytes": self.load_peak_bytes,
            "cache_bytes": self.cache_bytes,
            "process_peak_bytes": self.process_peak_bytes,
            "steps": self.steps,
            "seconds": self.seconds,
            "build_seconds": self.build_seconds,
            "backend": self.backend,
            "step_peaks_bytes": list(self.step_peaks_bytes),
            "tokens_per_second": self.tokens_per_second,
            "ranks": list(self.ranks),
            "method": self.method,
            **({"slice": self.slice} if self.slice is not None else {}),
        }


def _reader(stream, sink: queue.Queue) -> None:
    for line in stream:
        sink.put(line)
    sink.put(None)


def _tail_reader(stream, tail: deque) -> None:
    for line in stream:
        tail.append(line.rstrip())


def _memory_cap(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def request_for(
    model: ModelInfo,
    training: TrainingConfig,
    length: int | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    min_steps: int | None = None,
    synchronous: bool = False,
) -> dict:
    """What the child needs. `min_steps` (None: mlxfit/measure/steps.py MIN_STEPS) with
    `max_steps` fixes the step count; `synchronous` evaluates without running ahead
    of the CPU worker (steps.evaluated_synchronously): a deterministic peak for
    comparisons, not the figure an mlx-lm run reports."""
    if model.config is None:
        raise MlxfitError(
            f"{model.id} is a bare size with no architecture to build: measure a catalog id, "
            "a Hugging Face repo id or a folder with config.json"
        )
    arch = model.architecture
    return {
        "config": model.config,
        "folder": str(model.path) if model.path else None,
        "training": training.to_dict(),
        "length": length or training.max_seq_length,
        "vocab_size": arch.vocab_size,
        "max_steps": max_steps,
        "min_steps": min_steps,
        "synchronous": synchronous,
    }


def child_environment() -> dict:
    """The child imports this very mlxfit (not another install of it on the path):
    the folder that holds the mlxfit package (this file is mlxfit/measure/parent.py)
    goes first on PYTHONPATH, as the child runs in a temporary directory."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return env


def measure(
    request: dict,
    timeout: float | None = None,
    on_event: Callable[[dict], None] = lambda e: None,
    memory_cap: int | None = None,
) -> Measurement:
    """Run the child; return its Measurement or raise MeasurementFailed."""
    measured = run_child(request, timeout, on_event, memory_cap)["measured"]
    return Measurement(**{k: tuple(v) if isinstance(v, list) else v for k, v in measured.items()})


def run_child(
    request: dict,
    timeout: float | None = None,
    on_event: Callable[[dict], None] = lambda e: None,
    memory_cap: int | None = None,
    module: str = "mlxfit.measure.child",
) -> dict:
    """Run the child on one request; return its "done" event or raise MeasurementFailed.
    `module`: the child (mlxfit/measure/preference_child.py for mlx-lm-lora's modes)."""
    from .lifeline import FOLDER

    with tempfile.TemporaryDirectory(prefix="mlxfit-", ignore_cleanup_errors=True) as workdir:
        child = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=workdir,
            env={**child_environment(), FOLDER: workdir},
            start_new_session=True,  # Ctrl-C reaches us; we stop the child ourselves
            preexec_fn=_memory_cap(memory_cap) if memory_cap else None,
        )
        last: dict = {"step": 0, "peak_bytes": 0, "stage": "starting"}
        result = None
        try:
            events: queue.Queue = queue.Queue()
            stderr_tail: deque = deque(maxlen=20)
            threading.Thread(target=_reader, args=(child.stdout, events), daemon=True).start()
            threading.Thread(target=_tail_reader, args=(child.stderr, stderr_tail), daemon=True).start()
            # The request is one line; stdin then stays open as the child's lifeline: it
            # ends with this process, however it ends (mlxfit/measure/lifeline.py).
            child.stdin.write(json.dumps(request) + "\n")
            child.stdin.flush()

            deadline = time.monotonic() + timeout if timeout else None
            watch = _RssWatch(child.pid)
            while True:
                watch.sample()
                if deadline is not None and time.monotonic() > deadline:
                    _stop(child)
                    raise MeasurementFailed(
                        f"measurement timed out after {timeout:g} s at step {last['step']} "
                        f"(peak so far {format_gb(max(last['peak_bytes'], watch.peak), 2)}); "
                        "raise --timeout or shrink the run",
                        kind="timeout",
                    )
                try:
                    line = events.get(timeout=0.05)
                except queue.Empty:
                    continue
                if line is None:
                    break
                event = json.loads(line)
                on_event(event)
                if event["event"] == "stage":
                    last["stage"] = event["stage"]
                elif event["event"] in ("step", "built"):
                    last.update(step=event.get("step", 0), peak_bytes=event["peak_bytes"])
                elif event["event"] in ("done", "error"):
                    result = event
        except KeyboardInterrupt:
            _stop(child)
            raise MeasurementInterrupted(
                f"interrupted at step {last['step']}; the measuring process was stopped", kind="interrupted"
            ) from None
        finally:
            _close(child.stdin)  # on any other error here too: the child then ends by itself
        child.wait()

    if result is not None and result["event"] == "done":
        return result
    raise MeasurementFailed(_failure_message(child.returncode, result, last, max(last["peak_bytes"], watch.peak), stderr_tail))


class _RssWatch:
    """The child's resident memory seen from outside, so a killed child still has a figure."""

    def __init__(self, pid: int):
        import psutil

        try:
            self._process = psutil.Process(pid)
        except psutil.Error:
            self._process = None
        self.peak = 0

    def sample(self) -> None:
        if self._process is None:
            return
        try:
            self.peak = max(self.peak, self._process.memory_info().rss)
        except Exception:  # the child is gone
            self._process = None


def _failure_message(returncode: int, result: dict | None, last: dict, held: int, stderr_tail) -> str:
    in_steps = last["stage"] == "training steps"
    where = f"at step {last['step'] + 1}" if in_steps else f"while {last['stage']}"
    if result is not None:
        if result["kind"] == "input":
            return result["message"]
        held = max(held, result.get("process_peak_bytes", 0))
        if result["kind"] == "oom":
            return f"ran out of memory {where} after {format_gb(held, 2)} ({result['message']})"
        return f"the measuring process failed {where}: {result['message']}"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        if -returncode == signal.SIGKILL:
            return f"ran out of memory {where} after {format_gb(held, 2)}: the system killed the measuring process ({name})"
        if -returncode in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            return f"the measuring process was stopped ({name}) {where} after {format_gb(held, 2)}: something outside it ended it"
        return (
            f"the measuring process crashed ({name}) {where} after {format_gb(held, 2)}; MLX dies this way "
            "when an allocation fails, so it most likely ran out of memory"
        )
    detail = stderr_tail[-1] if stderr_tail else "no output"
    return f"the measuring process exited with status {returncode} {where}: {detail}"


def _close(stream) -> None:
    try:
        stream.close()
    except OSError:  # the child ended before reading it all
        pass


def _stop(child: subprocess.Popen) -> None:
    child.terminate()
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


@dataclass(frozen=True)
class Comparison:
    """A measurement beside its prediction, judged against the budget."""

    measurement: Measurement
    predicted_bytes: int
    usable_bytes: int
    note: str | None = None  # e.g. why it was not stored for calibration

    @property
    def error_pct(self) -> float:
        """Positive: the prediction was above the measured peak (the safe side)."""
        measured = self.measurement.peak_with_load_bytes
        return round(100.0 * (self.predicted_bytes - measured) / measured, 2)

    # The measured verdict is judged on the estimate's own basis: MLX's peak with the
    # load (what mlx-lm's trainer reports and the estimate predicts), without the
    # process's own resident baseline (the interpreter and libraries), which neither
    # the estimate nor bench's verdicts count.
    VERDICT_BASIS = "peak_with_load"

    @property
    def judged_bytes(self) -> int:
        return self.measurement.peak_with_load_bytes

    @property
    def cache_breaks_budget(self) -> bool:
        m = self.measurement
        return self.judged_bytes <= self.usable_bytes < m.peak_bytes + m.cache_bytes

    def to_dict(self) -> dict:
        from ..estimate.verdict import judge, measured_range

        judged = self.judged_bytes
        verdict = judge(*measured_range(judged), self.usable_bytes)
        return {
            "measured": self.measurement.to_dict(),
            "predicted_peak_bytes": self.predicted_bytes,
            "error_pct": self.error_pct,
            "measured_verdict": {
                "bytes": judged,
                "basis": self.VERDICT_BASIS,
                "verdict": verdict.value,
                "fits": judged <= self.usable_bytes,  # within the budget, margin aside
                "cache_breaks_budget": self.cache_breaks_budget,
            },
            **({"note": self.note} if self.note else {}),
        }
