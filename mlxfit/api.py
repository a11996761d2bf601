"""mlxfit as a library: three calls, and the command line is their first client.

- `estimate_run(model, **training)`: what one run needs, by the detailed estimate, with no
  machine and no budget;
- `plan(model, memory=..., **training)`: probe's plan for that run on a machine: each
  method against the budget, the verdicts, and what to change;
- `probe(model, memory=..., **training)`: probe's whole answer, as `mlxfit probe` gives
  it (`.to_dict()` is `probe --json`), every mode and every check included.

Training settings are mlx-lm's (or, with `train_mode`, mlx-lm-lora's) names, given
partially: what is not given comes from the YAML `config` and then the defaults, by
the same merge as the command line's flags. docs/python-api.md shows them in use.
(`mlxfit.estimate` is the subpackage of the estimates, so the first call is `estimate_run`.)
"""

from __future__ import annotations


def estimate_run(model, *, method: str | None = None, backend: str = "cpu", train_mode: str | None = None, length=None,
                 miniatures: bool = False, **training):
    """The detailed estimate of one run: for mlx-lm's SFT a Breakdown (`peak_bytes`,
    `parts` in bytes), for a DPO, CPO, ORPO or GRPO run the PreferenceEstimate of its
    phases. `model`: a catalog id, a folder or a config.json, as `--model`; `length`:
    the widest batch in tokens where not `max_seq_length`; `miniatures`: whether DPO, CPO
    and ORPO may count their logits buffers on miniatures of the model (shipped counts,
    remembered ones, else a child process of tens of seconds), else the fitted count."""
    from .estimate.sizing import predict
    from .model.resolve import resolve_model

    info = resolve_model(model)
    if info.architecture is None:
        from .errors import BadInput

        raise BadInput(f"{info.id}: no architecture to estimate (a bare size has the rule of thumb only: see plan)")
    if not _spec(train_mode).by_mlx_lm:
        from .estimate.preference import estimate_run
        from .model.preference import resolve_run

        run = resolve_run(_mode(train_mode), _preference_flags(training), {})
        return estimate_run(info, run, backend, length, miniatures=miniatures)
    _, breakdown = predict(info, _training(training, method), backend, length=length)
    return breakdown


def plan(model, *, method: str | None = None, memory=None, gpu_memory=None, reserve=None, backend: str | None = None,
         **training):
    """probe's plan for mlx-lm's SFT run (mlxfit.estimate.plan.Plan): each method's
    estimate against the budget of this machine, or of the one `memory` (unified) or
    `gpu_memory` (a discrete GPU) describe, with its verdict and, where the run does not
    fit, the remedies and the cheapest plan. Sizes as "36GB", "36GiB" or bytes."""
    from .answer import checked_run, get_machine
    from .estimate.plan import make_plan
    from .model.resolve import resolve_model

    info = resolve_model(model)
    settings = _training(training, method)
    checked_run(info, settings)
    return make_plan(get_machine(_size(memory), _size(gpu_memory), reserve), info, settings, backend=backend)


def probe(model=None, *, config=None, data=None, method=None, train_mode=None, memory=None, gpu_memory=None,
          reserve=None, backend=None, hostfile=None, skip_bad_lines=False, trust_remote_code=False, measure=False,
          by_slice=False, force=False, timeout=900, steps=6, progress=None, chip=None, iters=None, miniatures=False,
          **settings):
    """probe's answer, as the command line gives it: `.to_dict()` is what `probe --json`
    prints. `settings`: mlx-lm's training settings, and with `train_mode` (dpo, cpo,
    orpo, grpo, or from the YAML `config`) mlx-lm-lora's; `measure` trains a few steps
    here. `progress`: what a measurement shows while it runs (None: nothing). `chip`: the
    Apple chip to time the run on (as `--chip`); `iters`: the run's iterations (mlx-lm's, or
    mlx-lm-lora's); `miniatures`: as for estimate_run (the command line passes True unless
    MLXFIT_MINIATURES=0)."""
    from pathlib import Path

    from .answer import Silent, get_machine
    from .model.preference import RUN_FLAGS, mode_from, read_yaml, refuse_mode_flags, refuse_sft_flags

    progress = progress or Silent()
    images = {k: settings.pop(k, None) for k in ("image_size", "images_per_example", "train_vision", "cache_size")}
    _known(settings)
    found = _vision_config(model, config, train_mode)
    if found is not None:  # the model chooses its mode: mlx-vlm's
        from .answer_vision import probe as vision_probe

        refused = {"-c/--config": config, "--method": method, "--skip-bad-lines": skip_bad_lines,
                   "--trust-remote-code": trust_remote_code, "--chip": chip, "--iters": iters}
        refused.update({f"--{k.replace('_', '-')}": settings.pop(k) for k in RUN_FLAGS if k in settings})
        return vision_probe(found[0], found[1], found[2], found[3], data, {**settings, **images},
                            get_machine(_size(memory), _size(gpu_memory), reserve), backend, refused=refused,
                            hostfile=hostfile, do_measure=measure, by_slice=by_slice, force=force, timeout=timeout,
                            steps=steps, progress=progress, reserve=reserve)
    for key, value in images.items():
        if value not in (None, False):
            from .errors import BadInput

            raise BadInput(f"--{key.replace('_', '-')} is for vision-language models (a config.json with a "
                           "vision_config): this model has no vision part")
    pref = {k: settings.pop(k) for k in RUN_FLAGS if k in settings}
    mode = mode_from(train_mode, read_yaml(Path(config)) if config else {})
    memory, gpu_memory = _size(memory), _size(gpu_memory)
    if _spec(mode).by_mlx_lm:
        refuse_mode_flags(pref)
        from .answer import probe as sft_probe

        return sft_probe(model, settings, config_path=config, data=data, method=method, skip_bad_lines=skip_bad_lines,
                         trust_remote_code=trust_remote_code, hostfile=hostfile, backend=backend, do_measure=measure,
                         by_slice=by_slice, force=force, timeout=timeout, steps=steps, memory=memory,
                         gpu_memory=gpu_memory, reserve=reserve, progress=progress, chip=chip, iters=iters)
    refuse_sft_flags(mode, method is not None, settings.get("bits") is not None)
    from .answer_preference import probe as preference_probe

    return preference_probe(model, config, data, settings, {**pref, "train_mode": mode},
                            get_machine(memory, gpu_memory, reserve), backend, measure, timeout, steps, progress,
                            reserve, skip_bad_lines=skip_bad_lines, trust_remote_code=trust_remote_code,
                            hostfile=hostfile, by_slice=by_slice, force=force, chip=chip, iters=iters,
                            miniatures=miniatures)


def _vision_config(model, config, train_mode):
    """(model id, config.json, folder, mode) of a model whose config has a vision part: a
    local folder or config.json first, then a VLM whose config.json mlxfit ships
    (data/vlm_configs.json, offline), then a Hub id whose image facts it ships (its
    config.json from the Hub); None otherwise."""
    from pathlib import Path

    from .model.images import shipped_image_facts
    from .model.preference import read_yaml
    from .model.vision_run import folder_config
    from .model.vlm_catalog import shipped_vlm
    from .modes import for_model

    spec = model or (read_yaml(Path(config)).get("model") if config else None)
    local = folder_config(spec)
    shipped = shipped_vlm(spec)
    if local is not None:
        found = (str(spec), local[0], local[1])
    elif shipped is not None:  # the catalog's copy of the Hub's config.json, as for language models
        found = (shipped["id"], shipped["config"], None)
    elif spec and str(spec).lower() in shipped_image_facts():
        from .model.resolve import resolve_model

        found = (str(spec), resolve_model(str(spec)).config, None)
    else:
        return None
    mode = for_model(found[1], train_mode)
    return None if mode is None else (*found, mode)


def _size(value):
    """A memory size as the command line reads it ("36GB", "36GiB"), or bytes."""
    if value is None or isinstance(value, int):
        return value
    from .units import parse_bytes

    return parse_bytes(str(value))


def _known(settings: dict) -> None:
    from .errors import BadInput
    from .model.preference import RUN_FLAGS
    from .model.runconfig import _FLAG_KEYS

    known = (_FLAG_KEYS - {"model", "data"}) | set(RUN_FLAGS) | {"hosts"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise BadInput(f"unknown training setting {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _training(settings: dict, method: str | None):
    """mlx-lm's training settings, given partially, merged as the command line merges them."""
    from .model.runconfig import check_method, resolve, with_method

    _known(settings)
    check_method(method, settings.get("fine_tune_type"))
    return with_method(resolve(dict(settings)).training, method)


def _spec(train_mode: str | None):
    """The mode (mlxfit/modes/) called `train_mode`, SFT where None."""
    from .modes import DEFAULT, get_mode

    return get_mode(train_mode or DEFAULT)


def _mode(train_mode: str) -> str:
    from .model.preference import mode_from

    return mode_from(train_mode, {})


def _preference_flags(settings: dict) -> dict:
    _known(settings)
    return {**settings, "rl_group_size": settings.get("group_size")}
