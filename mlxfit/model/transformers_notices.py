"""transformers' notices kept off mlxfit's output (mlxfit imports transformers only for
a tokenizer and mlx-lm-lora's datasets and trainers)."""

from __future__ import annotations

import os


def quiet_transformers() -> None:
    """Before anything imports transformers: its notices are about its own PyTorch models,
    which mlxfit never uses ("[transformers] PyTorch was not found. Models won't be
    available ..." at import), so they are kept off mlxfit's output; its errors still
    raise. A value the user set for either variable is kept. The environment carries it
    to the measuring processes started afterwards."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # transformers/utils/logging.py warning_advice
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its logger's level when first configured
