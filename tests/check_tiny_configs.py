"""Build every tiny config with random weights and round-trip it through mlx-lm.

For each entry of tests/fixtures/tiny_configs.json: build the model from the
config, save its parameters as model.safetensors (leaving lm_head.weight out
when the config ties the embeddings, as a real checkpoint would) next to a
config.json, and load the folder back with mlx_lm.utils.load_model(strict=True).

Prints one line per entry: name, model_type, parameters of the loaded model,
OK/FAIL and the reason (for an OK entry: a note when the loaded count differs
from the built one, or the family's sanitize changes the saved key set). A full
run also fails every model module that has no entry in either fixture.
Usage: python tests/check_tiny_configs.py [--forward] [NAME ...]
--forward also runs the loaded model on 8 tokens and checks the logits' shape
(an entry whose forward pass needs a Metal kernel is reported OK with a note).
Exit status is the number of failures (0 when all round-trip).

What the entries showed about mlx-lm 0.32.2 (see also
tests/fixtures/tiny_configs_unbuildable.json):
- gemma3_text, gemma3 (its language model) and recurrent_gemma always build an
  lm_head and their sanitize pops it when the checkpoint has none, so a tied
  checkpoint loads with fewer parameters than the freshly built model. They
  read no tie_word_embeddings: a checkpoint with lm_head.weight keeps its head
  (gemma3_text_untied).
- minicpm with tie_word_embeddings=true cannot load strictly: the model has no
  lm_head but sanitize always adds lm_head.weight = embed_tokens.weight.
- phi3small's forward sets logits at hard-coded token ids 100256..100351 to
  -inf; with a small vocab_size that scatter is out of bounds and corrupts the
  heap on CPU, so --forward skips it.
- bitnet and muse_spark build and load on CPU, but their forward pass calls a
  Metal kernel.
"""

import json
import pathlib
import sys
import tempfile
import time
import traceback

import mlx.core as mx
from mlx.utils import tree_flatten
import mlx_lm.models
from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING, _get_classes, load_model

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "tiny_configs.json"
UNBUILDABLE = FIXTURE.with_name("tiny_configs_unbuildable.json")


def _module_of(config):
    """The mlx_lm.models module _get_classes picks for a config."""
    model_type = config["model_type"]
    for arch in config.get("architectures") or ():
        if (model_type, arch) in MODEL_ARCHITECTURE_REMAPPING:
            return MODEL_ARCHITECTURE_REMAPPING[(model_type, arch)]
    return MODEL_REMAPPING.get(model_type, model_type)


def uncovered_modules(configs):
    """Model modules (a file defining Model and ModelArgs) with no entry in
    either fixture."""
    folder = pathlib.Path(mlx_lm.models.__file__).parent
    modules = [
        f.stem
        for f in sorted(folder.glob("*.py"))
        if "\nclass Model(" in (t := f.read_text()) and "\nclass ModelArgs" in t
    ]
    covered = {_module_of(c) for c in configs.values()}
    covered |= set(json.loads(UNBUILDABLE.read_text()))
    return [m for m in modules if m not in covered]


def _tied(config):
    for c in (config, config.get("text_config") or {}):
        if isinstance(c, dict) and c.get("tie_word_embeddings"):
            return True
    return False


def _count(params):
    return sum(v.size for _, v in tree_flatten(params))


def _sanitize_note(model, saved):
    """How the family's sanitize changes MLX-layout keys (empty when it keeps them)."""
    if not hasattr(model, "sanitize"):
        return ""
    after = model.sanitize(dict(saved))
    added = sorted(set(after) - set(saved))
    dropped = sorted(set(saved) - set(after))
    reshaped = sorted(
        k for k in set(after) & set(saved) if tuple(after[k].shape) != tuple(saved[k].shape)
    )
    notes = []
    for label, keys in (("adds", added), ("drops", dropped), ("reshapes", reshaped)):
        if keys:
            notes.append(f"sanitize {label} {len(keys)} ({keys[0]}{', ...' if len(keys) > 1 else ''})")
    return "; ".join(notes)


def check(name, config, forward=False):
    """Return (params, status, reason) for one entry."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    built = sum(v.size for v in weights.values())
    if built <= 0:
        return built, "FAIL", "model has no parameters"
    mx.eval(list(weights.values()))
    saved = dict(weights)
    if _tied(config):
        saved = {k: v for k, v in saved.items() if not k.endswith("lm_head.weight")}
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d)
        with open(path / "config.json", "w") as f:
            json.dump(config, f)
        mx.save_safetensors(str(path / "model.safetensors"), saved)
        note = _sanitize_note(model, saved)
        loaded, _ = load_model(path, lazy=True, strict=True)
        n = _count(loaded.parameters())
    if n <= 0:
        return built, "FAIL", "loaded model has no parameters"
    if n != built:
        note = f"built {built} parameters, loaded {n}; {note}".rstrip("; ")
    if forward:
        tokens = mx.array([[1, 2, 3, 4, 5, 6, 7, 8]])
        dummy = getattr(loaded, "_dummy_tokenizer_ids", None)
        if dummy is not None and dummy.max().item() >= loaded.model.vocab_size:
            # phi3small sets logits[..., ids up to 100351] = -inf: with a small
            # vocabulary that scatter writes out of bounds (heap corruption on CPU).
            return n, "OK", f"forward skipped: hard-coded token ids need vocab_size > {dummy.max().item()}; {note}".rstrip("; ")
        try:
            logits = loaded(tokens)
            mx.eval(logits)
        except RuntimeError as e:
            if "No Metal back-end" not in str(e):
                raise
            return n, "OK", f"forward needs Metal; {note}".rstrip("; ")
        if logits.shape[:2] != (1, 8):
            return n, "FAIL", f"forward gave logits of shape {logits.shape}; {note}"
    return n, "OK", note


def main(argv):
    forward = "--forward" in argv
    argv = [a for a in argv if a != "--forward"]
    configs = json.loads(FIXTURE.read_text())
    names = argv or list(configs)
    failures = 0
    for name in names:
        config = configs[name]
        t0 = time.perf_counter()
        try:
            params, status, reason = check(name, config, forward)
        except BaseException as e:  # some modules sys.exit on import
            if isinstance(e, KeyboardInterrupt):
                raise
            params, status = 0, "FAIL"
            tb = traceback.extract_tb(e.__traceback__)[-1]
            where = f"{pathlib.Path(tb.filename).name}:{tb.lineno}"
            message = " ".join(str(e).split())[:200]
            reason = f"{type(e).__name__}: {message} [{where}]"
        failures += status != "OK"
        dt = time.perf_counter() - t0
        print(
            f"{name:32s} {config.get('model_type', '?'):24s} {params:>9d} "
            f"{status} {dt:5.2f}s {reason}".rstrip(),
            flush=True,
        )
    print(f"{len(names) - failures}/{len(names)} OK")
    if not argv:
        missing = uncovered_modules(configs)
        for m in missing:
            print(f"{m:32s} {'':24s} {0:>9d} FAIL no entry in tiny_configs.json or tiny_configs_unbuildable.json")
        failures += len(missing)
    return failures


if __name__ == "__main__":
    sys.exit(min(main(sys.argv[1:]), 125))
