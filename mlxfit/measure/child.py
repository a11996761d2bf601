"""The measuring process: `python -m mlxfit.measure.child` reads one JSON request on stdin,
builds the model, takes the steps, and writes JSON-line events to its stdout.

Everything else the child prints (mlx-lm's own messages) goes to stderr, so the
event stream stays clean. Runs in a throwaway working directory.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
import traceback
from dataclasses import replace

_OUT = None


def emit(event: str, **fields) -> None:
    _OUT.write(json.dumps({"event": event, **fields}) + "\n")
    _OUT.flush()


class RssSampler:
    """The process's resident set high-water mark, sampled every few milliseconds."""

    def __init__(self, interval: float = 0.005):
        import psutil

        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def high_water(self) -> int:
        # ru_maxrss: kilobytes on Linux, bytes on macOS.
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        maxrss *= 1 if sys.platform == "darwin" else 1024
        return max(self.peak, self._process.memory_info().rss, maxrss)


def is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, MemoryError) or any(
        marker in text for marker in ("unable to allocate", "out of memory", "insufficient memory", "std::bad_alloc", "bad_alloc")
    )


def gather_ranks(figures: list[int]) -> list[dict]:
    """Under mlx.launch, every rank's figures, gathered with mx.distributed."""
    import mlx.core as mx

    world = mx.distributed.init()
    values = [list(figures)]
    if world.size() > 1:
        # int32 cannot hold byte counts: send each as a (high, low) pair of 24-bit halves.
        halves = mx.array([[x >> 24, x & 0xFFFFFF] for x in figures], dtype=mx.int32).reshape(1, -1)
        rows = mx.distributed.all_gather(halves, stream=mx.cpu).tolist()
        values = [[row[2 * i] * 2**24 + row[2 * i + 1] for i in range(len(figures))] for row in rows]
    return [
        {"rank": i, "peak_bytes": v[0], "peak_with_load_bytes": v[1], "process_peak_bytes": v[2]}
        for i, v in enumerate(values)
    ]


class _NoTokenizer:
    """Stands in for every transformers class in the measuring process."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("the measuring process synthesizes its batches: it has no tokenizer (transformers is not loaded)")

    @classmethod
    def register(cls, *args, **kwargs):  # tokenizer_utils calls AutoTokenizer.register at import
        pass

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        cls()


class _TransformersStub:
    """An import hook serving `transformers` and its submodules as empty modules whose
    every name is a `_NoTokenizer` subclass.

    mlx-lm imports transformers at module level (mlx_lm/__init__.py imports
    convert -> utils -> tokenizer_utils; tuner/trainer.py imports tuner/datasets.py)
    only for tokenizers, which the child never needs: it synthesizes token ids.
    Loading transformers costs about 1.5 s of the child's start on this machine.
    """

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        if name == "transformers" or name.startswith("transformers."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        import types

        module = types.ModuleType(spec.name)
        module.__path__ = []
        classes: dict = {}

        def __getattr__(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            if attr not in classes:
                classes[attr] = type(attr, (_NoTokenizer,), {})
            return classes[attr]

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


def without_transformers() -> None:
    """Serve transformers from the stub, unless something already loaded it."""
    if "transformers" not in sys.modules:
        sys.meta_path.insert(0, _TransformersStub())


def transformers_imported() -> bool:
    """The real package has a file; the stub (or nothing) has none."""
    return getattr(sys.modules.get("transformers"), "__file__", None) is not None


def settled_peak(step_peaks: list[int], accumulation: int) -> int | None:
    """The least over the accumulation cycles after the first optimizer update of each
    cycle's largest step peak (None before a second cycle)."""
    k = accumulation
    cycles = [max(step_peaks[i:i + k]) for i in range(k, len(step_peaks) - k + 1, k)]
    return min(cycles) if cycles else None


def measure_once(request: dict, training, blocks: int | None = None, synchronous: bool = False, steps: int | None = None,
                 on_step=None) -> dict:
    """Build the model (its last `blocks` only, for a slice), take the steps (exactly
    `steps`, or the request's rule), free it. With `steps`, each step's own peak is
    read too, and `least_peak_bytes` is their least over the steps after the first
    optimizer update (the largest of each accumulation cycle): even evaluated
    synchronously the main thread may allocate up to nine kernels ahead of the CPU
    worker, whose lag only adds the inputs it has not yet released (about one
    activation from step to step, now and then a logits-sized buffer on a loaded
    machine), so the least is nearest the graph's own peak.

    Peaks are the process's MLX peak less what was already held, so one process can
    measure several slices in turn (mlxfit/measure/slicing.py)."""
    import gc
    from pathlib import Path

    import mlx.core as mx

    from .build import build
    from .steps import MIN_STEPS, batches, evaluated_synchronously, full_length_dataset, run_steps

    folder = Path(request["folder"]) if request.get("folder") else None
    with evaluated_synchronously(synchronous):
        mx.reset_peak_memory()
        held = mx.get_active_memory()
        tic = time.perf_counter()
        model = build(request["config"], folder, training, on_stage=lambda s: emit("stage", stage=s), blocks=blocks)
        load_peak = mx.get_peak_memory() - held
        build_seconds = time.perf_counter() - tic
        emit("built", seconds=build_seconds, peak_bytes=load_peak)

        mx.reset_peak_memory()
        dataset = full_length_dataset(training.batch_size, request["length"], request["vocab_size"])
        emit("stage", stage="training steps")
        tic = time.perf_counter()
        own_peaks = []

        def each_step(record):
            if steps:
                own_peaks.append(mx.get_peak_memory() - held)
                mx.reset_peak_memory()
            (on_step or (lambda r: None))(record)

        records = run_steps(
            model, training, batches(dataset, training), steps or request["max_steps"],
            min_steps=steps or request.get("min_steps") or MIN_STEPS, on_step=each_step,
        )
        seconds = time.perf_counter() - tic
        del model
        gc.collect()
        mx.clear_cache()
    steps_peak = max(own_peaks) if own_peaks else max(r.peak_bytes for r in records) - held
    least = settled_peak(own_peaks, training.grad_accumulation_steps)
    return {
        **({"least_peak_bytes": least} if least is not None else {}),
        "peak_bytes": steps_peak,
        "peak_with_load_bytes": max(load_peak, steps_peak),
        "load_peak_bytes": load_peak,
        "cache_bytes": records[-1].cache_bytes,
        "steps": len(records),
        "seconds": seconds,
        "build_seconds": build_seconds,
        "step_peaks_bytes": own_peaks or [r.peak_bytes - held for r in records],
        "step_seconds": [r.seconds for r in records],
        "tokens_per_step": records[-1].tokens,
    }


def run(request: dict) -> None:
    """One run (`measured`), or the slices a request lists, in turn (`slices`)."""
    from ..errors import MlxfitError
    from ..model.training import TrainingConfig

    training = TrainingConfig(**request["training"])
    step_now = 0

    def on_step(record):
        nonlocal step_now
        step_now = record.step
        emit("step", step=record.step, peak_bytes=record.peak_bytes, seconds=record.seconds, tokens=record.tokens)

    with RssSampler() as rss:
        try:
            emit("stage", stage="importing mlx-lm")
            without_transformers()
            import mlx.core as mx

            from ..machine import mlx_backend

            if request.get("slices"):
                slices = []
                for i, s in enumerate(request["slices"], 1):
                    emit("slice", index=i, of=len(request["slices"]), blocks=s["blocks"], trained=s["trained"],
                         synchronous=s["synchronous"])
                    sliced = replace(training, num_layers=s["trained"])
                    slices.append(measure_once(request, sliced, s["blocks"], s["synchronous"], s.get("steps"), on_step))
                emit("done", slices=slices, backend=mlx_backend(), process_peak_bytes=rss.high_water(),
                     transformers_imported=transformers_imported())
                return
            measured = measure_once(request, training, synchronous=request.get("synchronous", False), on_step=on_step)
            figures = [measured["peak_bytes"], measured["peak_with_load_bytes"], rss.high_water()]
            emit(
                "done",
                rank=mx.distributed.init().rank(),
                measured={**measured, "ranks": gather_ranks(figures), "process_peak_bytes": rss.high_water(),
                          "backend": mlx_backend()},
                transformers_imported=transformers_imported(),
            )
        except MlxfitError as e:
            emit("error", kind="input", message=str(e), step=step_now)
        except Exception as e:  # noqa: BLE001 - every failure becomes a report
            kind = "oom" if is_out_of_memory(e) else "crash"
            emit(
                "error",
                kind=kind,
                message=f"{type(e).__name__}: {e}",
                step=step_now,
                process_peak_bytes=rss.high_water(),
                traceback=traceback.format_exc(limit=8),
            )


def serve(run_request) -> None:
    """What every measuring process speaks: one JSON request on the first line of stdin,
    JSON-line events on the original stdout; whatever else is printed (mlx-lm's messages)
    goes to stderr. Its stdin stays open while the parent lives: at its end the process
    removes its folder and ends (mlxfit/measure/lifeline.py)."""
    global _OUT
    from .lifeline import receive

    _OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    run_request(receive())


def main() -> None:
    serve(run)


if __name__ == "__main__":
    main()
