"""mlxfit: will fine-tuning this model fit in this machine's memory?"""

__version__ = "0.1.0"
__all__ = ["__version__", "estimate_run", "plan", "probe"]  # docs/python-api.md


def estimate_run(model, **training):
    """What one run needs, by the detailed estimate (mlxfit.api.estimate_run)."""
    from .api import estimate_run

    return estimate_run(model, **training)


def plan(model, **settings):
    """probe's plan for a run on a machine (mlxfit.api.plan)."""
    from .api import plan

    return plan(model, **settings)


def probe(model=None, **settings):
    """probe's whole answer; `.to_dict()` is `probe --json` (mlxfit.api.probe)."""
    from .api import probe

    return probe(model, **settings)


def data_text(name: str) -> str:
    """A file shipped in mlxfit/data, read as a plain file (importlib.resources
    costs more to import than an estimate takes)."""
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", name), encoding="utf-8") as f:
        return f.read()
