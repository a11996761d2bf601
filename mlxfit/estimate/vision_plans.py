"""What to change when an mlx-vlm run does not fit: each change re-estimated on the run it
makes (the images counted again by the family's rule, the step sized again), never scaled.

The changes, in mlx_vlm.train's terms:
- a `max_pixels` cap (Qwen families: the processor's smart_resize keeps every image under
  it; set in the model folder's preprocessor_config.json, which mlx-vlm's processor reads):
  fewer patches for the tower and fewer image tokens for the language model;
- fewer images per example (without --data, as --images-per-example stands in);
- the vision tower frozen again (--train-vision left out);
- no LoRA dropout (--lora-dropout 0, where the run has it);
- --grad-checkpoint;
- a smaller --cache-size (the processed rows' pixel values mlx-vlm keeps);
- batch 1 with --gradient-accumulation-steps making up the batch.

Memory only: mlxfit has no step time for mlx-vlm's trainer yet."""

from __future__ import annotations

from collections.abc import Callable

from ..model.images import QwenRules
from .preference import Change
from .remedies import no_dropout_costs
from .vision import run_estimate

PIXEL_STEP = 2  # each cap offered holds half the pixels of the one before


def _caps(run) -> list[int]:
    """max_pixels caps below the run's largest image, each half the one before, while at
    least the processor's min_pixels."""
    rules = run.rules
    if not isinstance(rules, QwenRules) or not run.images:
        return []
    unit = (rules.patch_size * rules.merge_size) ** 2
    largest = run.pixel_shape[0] * rules.patch_size ** 2 // run.images  # patches x patch^2 of one image
    caps, cap = [], largest // PIXEL_STEP
    while cap >= max(rules.min_pixels, unit) and len(caps) < 3:
        caps.append(cap // unit * unit)
        cap //= PIXEL_STEP
    return caps


def variants(run) -> list[tuple[str, str, dict, int | None]]:
    """(flags, cost, settings changed, max_pixels) of each change that lowers the peak."""
    t = run.training
    out = []
    for cap in _caps(run):
        per_image = run.image_tokens // max(run.images, 1)
        tokens = cap // (run.rules.patch_size * run.rules.merge_size) ** 2
        out.append((f"max_pixels {cap}", f"images downscaled: at most {tokens} image tokens each instead of "
                    f"{per_image} (preprocessor_config.json's max_pixels, read by mlx-vlm's processor)", {}, cap))
    if run.data is None and run.images > 1:
        for n in sorted({1, run.images // 2} - {run.images}, reverse=True):
            out.append((f"--images-per-example {n}", f"{n} image{'s' if n > 1 else ''} per example instead of "
                        f"{run.images} (fewer images in the data)", {"images_per_example": n}, None))
    if t.train_vision:
        out.append(("no --train-vision", "the vision tower and projector stay frozen (LoRA on the language model only)",
                    {"train_vision": None}, None))
    if t.lora_dropout and t.train_type != "full":
        out.append(("--lora-dropout 0", no_dropout_costs(t.lora_dropout), {"dropout": 0.0}, None))
    if not t.grad_checkpoint:
        out.append(("--grad-checkpoint", "a slower step: every block's forward runs again in the backward",
                    {"grad_checkpoint": True}, None))
    if t.cache_size is None or t.cache_size > t.batch_size:
        out.append((f"--cache-size {t.batch_size}", "rows processed again each time they are drawn (slower data)",
                    {"cache_size": t.batch_size}, None))
    if t.batch_size > 1:
        steps = t.batch_size * t.gradient_accumulation_steps
        out.append((f"--batch-size 1 --gradient-accumulation-steps {steps}",
                     f"the same {t.batch_size}-example update in {steps} steps", {"batch_size": 1,
                     "grad_accumulation_steps": steps}, None))
    return out


def plans(info, run, usable: int, resolve: Callable) -> dict:
    """{"singles": each change alone, "combination": changes added while the run does not fit}
    as estimate/preference.py's Change. `resolve(settings, max_pixels)`: the run those make."""
    base = run_estimate(info, run)
    singles = []
    for flags, cost, settings, cap in variants(run):
        e = run_estimate(info, resolve(settings, cap))
        if e.peak_bytes < base.peak_bytes:
            singles.append(Change(flags, cost, e.peak_bytes, e.verdict(usable)))
    combination = []
    if not base.verdict(usable).fits and not any(c.fits for c in singles):
        combination = _combined(info, run, usable, resolve, base.peak_bytes)
    return {"singles": singles, "combination": combination}


def _combined(info, run, usable: int, resolve: Callable, now: int) -> list:
    """The change that lowers the peak most, added to those before, until the run fits."""
    chosen, settings, cap, combo = set(), {}, None, []
    for _ in range(5):
        best = None
        for flags, cost, change, c in variants(run):
            option = flags.split()[0]
            if option in chosen:
                continue
            e = run_estimate(info, resolve({**settings, **change}, c if c is not None else cap))
            if e.peak_bytes < now and (best is None or e.peak_bytes < best[0]):
                best = (e.peak_bytes, flags, cost, change, c, e)
        if best is None:
            break
        now, flags, cost, change, c, e = best
        chosen.add(flags.split()[0])
        settings, cap = {**settings, **change}, c if c is not None else cap
        run = resolve(settings, cap)
        combo.append(Change(flags, cost, now, e.verdict(usable)))
        if combo[-1].fits:
            break
    return combo
