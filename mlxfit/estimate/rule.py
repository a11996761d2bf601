"""The rule of thumb for fine-tuning memory, reproduced exactly as it is quoted.

Per billion parameters, plus a fixed part for the adapter, activations at
moderate lengths and the framework. GB = 10^9 bytes.
"""

from __future__ import annotations

from ..units import GB

# method -> (GB per billion parameters, fixed GB)
RULES: dict[str, tuple[float, float]] = {
    "lora": (2.0, 3.0),  # frozen 16-bit base
    "qlora": (0.7, 3.0),  # frozen 4-bit base, about a quarter of 16-bit
    "full": (12.0, 4.0),  # 16-bit weight + 16-bit grad + two fp32 Adam moments
    "full_fp32_master": (16.0, 4.0),  # plus a 32-bit master copy
}

METHOD_LABELS = {
    "lora": "LoRA",
    "qlora": "QLoRA",
    "full": "full",
    "full_fp32_master": "full + fp32 master",
}


def rule_bytes(method: str, params: int) -> int:
    per_billion, fixed = RULES[method]
    return int(round((per_billion * params / 1e9 + fixed) * GB))
