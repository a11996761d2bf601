"""mlxfit: will fine-tuning this model fit in this machine's memory?"""

__version__ = "0.1.0"


def data_text(name: str) -> str:
    """A file shipped in mlxfit/data, read as a plain file (importlib.resources
    costs more to import than an estimate takes)."""
    import os

    with open(os.path.join(os.path.dirname(__file__), "data", name), encoding="utf-8") as f:
        return f.read()
