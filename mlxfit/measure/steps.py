"""A few real training steps, exactly as mlx-lm's trainer takes them.

mlx_lm/tuner/trainer.py `train` has no reusable step: its loop also validates,
reports and saves adapters. This mirrors the part that decides memory: gradient
checkpointing on the block class, `nn.value_and_grad` over mlx-lm's
`default_loss`, the compiled step over model/optimizer/random state, the
optimizer update, `mx.eval(state, ...)` after each step and the allocator cache
cleared after it. Batches come from
mlx-lm's own `iterate_batches`. tests/test_measure_steps.py checks the peak against the
real trainer.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.nn.utils import average_gradients
from mlx.utils import tree_map

from ..model.training import TrainingConfig

LEARNING_RATE = 1e-5  # mlx_lm/lora.py CONFIG_DEFAULTS["learning_rate"]
MIN_STEPS = 3  # the optimizer state appears at the first update; the peak settles after it
CLEAR_CACHE_THRESHOLD = 0  # mlx_lm/tuner/trainer.py TrainingArgs.clear_cache_threshold


def make_optimizer(name: str) -> optim.Optimizer:
    """mlx_lm/lora.py train_model: the optimizer class by name, default config."""
    classes = {
        "adam": optim.Adam,
        "adamw": optim.AdamW,
        "muon": optim.Muon,
        "sgd": optim.SGD,
        "adafactor": optim.Adafactor,
    }
    return classes[name](learning_rate=LEARNING_RATE)


def full_length_dataset(batch_size: int, length: int, vocab_size: int, seed: int = 0) -> list:
    """`batch_size` examples of exactly `length` tokens: the worst batch mlx-lm can make.

    Items are (tokens, offset) pairs, the shape iterate_batches accepts.
    """
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab_size, size=length).tolist(), 0) for _ in range(batch_size)]


def batches(dataset: list, training: TrainingConfig):
    """As the trainer calls it: under mlx.launch each rank takes its share of a batch."""
    from mlx_lm.tuner.trainer import iterate_batches

    return iterate_batches(
        dataset, training.batch_size, training.max_seq_length, loop=True, seed=0, comm_group=mx.distributed.init()
    )


@dataclass(frozen=True)
class StepRecord:
    step: int
    peak_bytes: int  # mx.get_peak_memory() since the reset before the steps
    active_bytes: int
    seconds: float
    tokens: int
    cache_bytes: int = 0  # the largest allocator cache seen after a step, before it was cleared


def run_steps(
    model: nn.Module,
    training: TrainingConfig,
    batch_iter,
    max_steps: int,
    min_steps: int = MIN_STEPS,
    on_step: Callable[[StepRecord], None] = lambda r: None,
    stable_within: float = 0.001,
) -> list[StepRecord]:
    """Train until the peak has held for two steps (at least `min_steps`, at most
    `max_steps`). One step is not enough: on the CPU backend the step at which
    the optimizer state and the gradients first overlap varies from run to run."""
    from mlx_lm.utils import maybe_set_recommended_wired_limit

    maybe_set_recommended_wired_limit()
    optimizer = make_optimizer(training.optimizer)
    with checkpointed(model.layers[0] if training.grad_checkpoint else None):
        return _run_steps(model, training, optimizer, batch_iter, max_steps, min_steps, on_step, stable_within)


@contextmanager
def checkpointed(block: nn.Module | None):
    """mlx-lm's grad_checkpoint on the block's class (none: no checkpointing). It
    patches the class for the rest of the process; the class is restored after the
    steps, so a process that measures several models in turn (the slices of
    mlxfit/measure/slicing.py) never wraps a block in two checkpoints."""
    if block is None:
        yield
        return
    from mlx_lm.tuner.trainer import grad_checkpoint

    cls = type(block)
    original = cls.__call__
    grad_checkpoint(block)
    try:
        yield
    finally:
        cls.__call__ = original


def _run_steps(model, training, optimizer, batch_iter, max_steps, min_steps, on_step, stable_within):
    from mlx_lm.tuner.trainer import default_loss

    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    grad_accum_steps = training.grad_accumulation_steps
    state = [model.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch, prev_grad, do_update):
        (lvalue, toks), grad = loss_value_and_grad(model, *batch)
        if prev_grad is not None:
            grad = tree_map(lambda x, y: x + y, grad, prev_grad)
        if do_update:
            grad = average_gradients(grad)
            if grad_accum_steps > 1:
                grad = tree_map(lambda x: x / grad_accum_steps, grad)
            optimizer.update(model, grad)
            grad = None
        return lvalue, toks, grad

    model.train()
    records: list[StepRecord] = []
    cache_bytes = 0
    grad_accum = None
    # Every optimizer update must be seen: the optimizer state appears at the first.
    min_steps = max(min_steps, grad_accum_steps + 1)
    for it, batch in zip(range(1, max_steps + 1), batch_iter):
        tic = time.perf_counter()
        lvalue, toks, grad_accum = step(batch, grad_accum, it % grad_accum_steps == 0)
        mx.eval(state, lvalue, toks, grad_accum)
        cache_bytes = max(cache_bytes, mx.get_cache_memory())
        # The trainer's _clear_cache(args.clear_cache_threshold), default 0: the
        # allocator cache is emptied after every step, so each step allocates afresh.
        if mx.get_cache_memory() > CLEAR_CACHE_THRESHOLD:
            mx.clear_cache()
        record = StepRecord(
            step=it,
            peak_bytes=mx.get_peak_memory(),
            active_bytes=mx.get_active_memory(),
            seconds=time.perf_counter() - tic,
            tokens=int(toks.item()),
            cache_bytes=cache_bytes,
        )
        records.append(record)
        on_step(record)
        stable = it >= min_steps and record.peak_bytes <= records[-3].peak_bytes * (1 + stable_within)
        if _all_agree(stable):
            break
    return records


@contextmanager
def evaluated_synchronously(on: bool = True):
    """Make every later `mx.eval` wait for the CPU worker, so a peak is the graph's
    own and not the scheduler's.

    On the CPU backend `mx.eval` runs ahead of the computation: the main thread
    allocates each op's outputs and hands the kernel to the stream's worker thread
    (mlx/backend/cpu/eval.cpp), which releases the op's inputs only when it runs.
    The main thread waits only once more than MAX_ACTIVE_TASKS (10) tasks of
    DISPATCHES_PER_TASK (10) kernels each are pending (mlx/transforms.cpp,
    mlx/backend/cpu/encoder.h), so the peak holds the outputs of up to ~100 ops not
    yet computed, and how many depends on thread scheduling: on a loaded machine
    the same step peaked 4% apart in two runs. `eval_impl` also waits for the
    worker after every op while active memory exceeds the memory limit; a limit of
    0 keeps it at most one task (10 kernels) ahead. Slower (the main thread spins),
    so only for comparisons that must be exact; mlx-lm's own runs are asynchronous.
    The limit is restored afterwards. Even so a peak moves by about one
    activation-sized buffer from step to step (the one task still pending).
    """
    if not on:
        yield
        return
    previous = mx.set_memory_limit(0)
    try:
        yield
    finally:
        mx.set_memory_limit(previous)


def _all_agree(flag: bool) -> bool:
    """Under mlx.launch every rank must stop at the same step, or the others wait on
    a peer that has gone: stop only when every rank's peak has settled."""
    world = mx.distributed.init()
    if world.size() == 1:
        return flag
    votes = mx.distributed.all_sum(mx.array(int(flag)), stream=mx.cpu)
    return int(votes.item()) == world.size()
