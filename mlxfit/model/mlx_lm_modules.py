"""mlx-lm's model and adapter modules, imported without mlx-lm's package __init__.

`import mlx_lm` runs mlx_lm/__init__.py, which imports transformers (seconds).
The model files themselves import only mlx and their sibling modules, and
mlx_lm/tuner/lora.py and dora.py only mlx and models/switch_layers.py. So, when
mlx-lm is not imported yet, its packages are registered without running their
__init__; the first attribute asked of such a package (`mlx_lm.load`, say) runs
the real __init__ then, so later code that imports mlx-lm sees it whole.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

# mlx_lm/utils.py: MODEL_REMAPPING and MODEL_ARCHITECTURE_REMAPPING (copied:
# importing mlx_lm.utils imports transformers; tests/test_model_architecture.py pins both).
MODEL_REMAPPING = {
    "mistral": "llama",
    "llava": "mistral3",
    "phi-msft": "phixtral",
    "falcon_mamba": "mamba",
    "joyai_llm_flash": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "qwen2_5_vl": "qwen2_vl",
    "minimax_m2": "minimax",
    "iquestcoder": "llama",
    "xverse": "llama",
    "gemma4_unified": "gemma4",
    "deepseek_v41_text": "deepseek_v41",
}
MODEL_ARCHITECTURE_REMAPPING = {
    ("bailing_hybrid", "BailingMoeV3ForCausalLM"): "bailing_moe_v3",
}
# Modules of mlx_lm/models that are building blocks, not models.
_NOT_MODELS = {"activations", "base", "bitlinear_layers", "cache", "gated_delta", "mla", "pipeline", "rope_utils", "ssm", "switch_layers"}


def _register_without_init(name: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(f"{name} is not installed")
    package = importlib.util.module_from_spec(spec)

    def __getattr__(attr):
        if attr.startswith("__") and attr not in ("__version__", "__all__"):
            raise AttributeError(attr)
        del package.__dict__["__getattr__"]
        spec.loader.exec_module(package)
        return getattr(package, attr)

    package.__getattr__ = __getattr__
    sys.modules[name] = package


def import_module(name: str):
    """`mlx_lm.<name>` (e.g. "models.llama", "tuner.lora") without transformers."""
    for package in ("mlx_lm", "mlx_lm.tuner"):
        _register_without_init(package)
    return importlib.import_module(f"mlx_lm.{name}")


def module_name(config: dict) -> str:
    """The mlx_lm.models module mlx-lm's loader picks (mlx_lm/utils.py _get_classes)."""
    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    for architecture in architectures:
        remapped = MODEL_ARCHITECTURE_REMAPPING.get((model_type, architecture))
        if remapped is not None:
            return remapped
    return MODEL_REMAPPING.get(model_type, model_type)


def model_classes(config: dict):
    """(Model, ModelArgs) for a config; raises ImportError for an unknown model_type."""
    name = module_name(config)
    if not isinstance(name, str) or not name.replace("-", "_").replace("_", "").isalnum():
        raise ImportError(f"no mlx-lm model for {name!r}")
    import contextlib
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            module = import_module(f"models.{name}")
    except SystemExit as e:  # olmo.py: prints what to install, then sys.exit(1) at import
        error = ImportError(f"mlx-lm's models/{name}.py exits when imported")
        error.needs = said.getvalue().strip() or f"mlx_lm.models.{name} exits when imported"
        raise error from e
    return module.Model, module.ModelArgs


def installed_model_types() -> list[str]:
    """Every model module of the installed mlx-lm."""
    spec = importlib.util.find_spec("mlx_lm")
    folder = os.path.join(spec.submodule_search_locations[0], "models")
    names = {f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_")}
    return sorted(names - _NOT_MODELS)


def version() -> str:
    return import_module("_version").__version__
