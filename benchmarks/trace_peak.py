"""What is alive at the peak of one training step of an accuracy-grid row (CPU backend).

    python benchmarks/trace_peak.py 148                    # row 148 of benchmarks/accuracy.py's grid
    python benchmarks/trace_peak.py 148 --set '{"method": "lora"}' --sync

A malloc shim (C, compiled here with the system's cc and preloaded with LD_PRELOAD) logs every
allocation of 32 KB or more and every free of one, during the last of a few training steps taken
as mlx-lm's trainer takes them (mlxfit/measure/steps.py: value_and_grad over default_loss, the compiled
step, the optimizer update; the allocator cache off, so a free is a free). The log is replayed:
the largest total alive, and what is alive then, by size, each size also as elements per token
(B x T); when the peak falls elsewhere, the same for the loss's backward (the most alive while
three or more logits-sized buffers are). Recording starts before the model is built, so a buffer
made before the traced step and freed in it (a weight the update replaces) counts as freed. `--sync` makes mx.eval wait for the worker after each task (memory limit 0), which
removes the CPU's run-ahead (mlxfit/estimate/detailed.py ahead_of_loss) and shows the graph's own peak.
Linux (glibc) only; the estimator's terms were checked against these traces.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdatomic.h>
extern void *__libc_malloc(size_t); extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t); extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
#define THRESH (32 * 1024)
#define TBL (1 << 20)
#define MAXEV (4 << 20)
typedef struct { int64_t size; uint64_t ptr; } ev_t; /* size < 0: a free */
static ev_t evs[MAXEV]; static atomic_long nev = 0;
static uint64_t keys[TBL]; static int64_t vals[TBL];
static atomic_flag lock = ATOMIC_FLAG_INIT; static int enabled = 0;
static void lk(void) { while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire)); }
static void ul(void) { atomic_flag_clear_explicit(&lock, memory_order_release); }
static uint64_t h(uint64_t p) { p ^= p >> 33; p *= 0xff51afd7ed558ccdULL; p ^= p >> 33; return p & (TBL - 1); }
static void put(uint64_t p, int64_t s) { uint64_t i = h(p); while (keys[i] > 1 && keys[i] != p) i = (i + 1) & (TBL - 1); keys[i] = p; vals[i] = s; }
static int64_t take(uint64_t p) { uint64_t i = h(p); while (keys[i]) { if (keys[i] == p) { keys[i] = 1; return vals[i]; } i = (i + 1) & (TBL - 1); } return 0; }
static void log_ev(int64_t s, uint64_t p) { long n = atomic_fetch_add(&nev, 1); if (n < MAXEV) { evs[n].size = s; evs[n].ptr = p; } }
static void rec(void *p, size_t s) { if (!enabled || !p || s < THRESH) return; lk(); put((uint64_t)p, (int64_t)s); log_ev((int64_t)s, (uint64_t)p); ul(); }
static void unrec(void *p) { if (!enabled || !p) return; lk(); int64_t s = take((uint64_t)p); if (s) log_ev(-s, (uint64_t)p); ul(); }
void *malloc(size_t s) { void *p = __libc_malloc(s); rec(p, s); return p; }
void free(void *p) { unrec(p); __libc_free(p); }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); rec(p, a * b); return p; }
void *realloc(void *q, size_t s) { unrec(q); void *p = __libc_realloc(q, s); rec(p, s); return p; }
void *aligned_alloc(size_t a, size_t s) { void *p = __libc_memalign(a, s); rec(p, s); return p; }
void *memalign(size_t a, size_t s) { void *p = __libc_memalign(a, s); rec(p, s); return p; }
int posix_memalign(void **r, size_t a, size_t s) { void *p = __libc_memalign(a, s); if (!p) return 12; *r = p; rec(p, s); return 0; }
void mt_enable(int e) { enabled = e; }
void mt_reset(void) { lk(); atomic_store(&nev, 0); ul(); }
long mt_dump(const char *path) { lk(); long n = atomic_load(&nev); if (n > MAXEV) n = MAXEV;
  FILE *f = fopen(path, "wb"); if (f) { fwrite(evs, sizeof(ev_t), n, f); fclose(f); } ul(); return n; }
"""


def preload_and_rerun(args: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="mlxfit-trace-"))
    (work / "shim.c").write_text(SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(work / "shim.so"), str(work / "shim.c")], check=True)
    env = dict(os.environ, MLXFIT_TRACE_SHIM=str(work / "shim.so"))
    env["LD_PRELOAD"] = " ".join(x for x in (env.get("LD_PRELOAD"), str(work / "shim.so")) if x)
    sys.exit(subprocess.run([sys.executable, __file__, *args], env=env).returncode)


def run_step(spec: dict, sync: bool, steps: int, log: Path) -> dict:
    from functools import partial

    from mlxfit.measure.child import without_transformers

    without_transformers()
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.trainer import default_loss, grad_checkpoint

    import accuracy
    from mlxfit.estimate.detailed import estimate
    from mlxfit.measure.build import build
    from mlxfit.measure.steps import batches, full_length_dataset, make_optimizer

    shim = ctypes.CDLL(os.environ["MLXFIT_TRACE_SHIM"])
    model_info, training = accuracy.model_and_training(spec)
    mx.set_cache_limit(0)
    # Recording from the start, so that a free during the traced step of a buffer made before it
    # (an old weight or optimizer state the update replaces) is logged with its size.
    shim.mt_enable(1)
    if sync:
        mx.set_memory_limit(0)
    model = build(dict(accuracy.ARCHS[spec["arch"]], torch_dtype=spec["dtype"]), None, training)
    load_peak = mx.get_peak_memory()
    data = full_length_dataset(training.batch_size, spec["max_seq_length"], model_info.architecture.vocab_size)
    optimizer = make_optimizer(training.optimizer)
    if training.grad_checkpoint:
        grad_checkpoint(model.layers[0])
    loss_and_grad = nn.value_and_grad(model, default_loss)
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch):
        (loss, toks), grad = loss_and_grad(model, *batch)
        optimizer.update(model, grad)
        return loss, toks

    model.train()
    for i, batch in zip(range(1, steps + 1), batches(data, training)):
        if i == steps:
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            shim.mt_reset()
        mx.eval(state, *step(batch))
        if i == steps:
            shim.mt_enable(0)
        mx.clear_cache()
    shim.mt_dump(str(log).encode())
    f = estimate(model_info, training).features
    return {"before": before, "peak": max(mx.get_peak_memory(), load_peak), "tokens": training.batch_size * f["tokens"],
            "logits": f["logits_bytes"],
            "predicted": estimate(model_info, training).peak_bytes, "phase": f["phase"]}


def replay(events, logits: int) -> tuple[int, int, int, int]:
    """The most alive after the step began and the event it is reached at; also the most alive
    while 3 or more logits-sized buffers are (the loss's backward) and its event (-1: never)."""
    live, total, peak, at, loss_peak, loss_at, n_logits = {}, 0, 0, 0, 0, -1, 0

    def is_logits(size) -> bool:  # the allocator may add a few bytes to a request
        return size is not None and abs(size - logits) <= 64

    for i, (size, ptr) in enumerate(events.tolist()):
        if size > 0:
            live[ptr] = size
            total += size
            n_logits += is_logits(size)
            if total > peak:
                peak, at = total, i
        else:  # a buffer of this step, or one made before it (then it counts below the start)
            n_logits -= is_logits(live.pop(ptr, None))
            total += size
        if n_logits >= 3 and total > loss_peak:
            loss_peak, loss_at = total, i
    return peak, at, loss_peak, loss_at


def alive_at(events, at: int) -> collections.Counter:
    live = {}
    for size, ptr in events[: at + 1].tolist():
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    return collections.Counter(live.values())


def show(alive: collections.Counter, peak: int, tokens: int) -> None:
    for size, n in sorted(alive.items(), key=lambda kv: -kv[0] * kv[1]):
        if size * n >= 0.005 * peak:
            print(f"  {size / 1e6:10.3f} x {n:4d} = {size * n / 1e6:8.1f}  ({size / 4 / tokens:.1f} 4-byte words per token)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("index", type=int, help="a row of benchmarks/accuracy.py's grid or of its held-out checks")
    parser.add_argument("--set", default="{}", help="JSON overrides of the row (method, batch_size, ...)")
    parser.add_argument("--sync", action="store_true", help="no run-ahead: mx.eval waits for the worker")
    parser.add_argument("--steps", type=int, default=3, help="steps taken; the last is traced")
    args = parser.parse_args()
    if "MLXFIT_TRACE_SHIM" not in os.environ:
        preload_and_rerun(sys.argv[1:])
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    import accuracy

    spec = {**next(s for s in accuracy.every_row() if s["index"] == args.index), **json.loads(args.set)}
    log = Path(os.environ["MLXFIT_TRACE_SHIM"]).parent / "events.bin"
    r = run_step(spec, args.sync, args.steps, log)
    import numpy as np

    events = np.fromfile(log, dtype=[("size", "<i8"), ("ptr", "<u8")])
    peak, at, loss_peak, loss_at = replay(events, r["logits"])
    mb = 1e6
    print(f"{json.dumps(spec)}")
    print(f"MLX peak {r['peak'] / mb:.1f} MB (predicted {r['predicted'] / mb:.1f} MB, at the {r['phase']} moment); "
          f"before the step {r['before'] / mb:.1f} MB; traced: {peak / mb:.1f} MB more at event {at}")
    print("alive at the traced peak: size x count = MB (4-byte words per token)")
    show(alive_at(events, at), peak, r["tokens"])
    if loss_at >= 0 and loss_at != at:
        print(f"at the loss (the most alive while 3 or more logits-sized buffers are): {loss_peak / mb:.1f} MB more at event {loss_at}")
        show(alive_at(events, loss_at), loss_peak, r["tokens"])


if __name__ == "__main__":
    main()
