"""How much memory this machine can give a training run.

Every platform read goes through `read_platform()`, which returns plain
`PlatformReadings`; tests build readings by hand (recorded from a Mac, a CUDA box
and a CPU-only Linux box) instead of touching the real machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import BadInput
from .units import GB, GiB, format_gb, parse_bytes

UNIFIED_RESERVE = 0.25  # the OS and other apps share unified memory: count about three quarters
# Apple's unified memory sizes, sold in GB but built in GiB.
APPLE_MEMORY_SIZES = (8, 16, 18, 24, 32, 36, 48, 64, 96, 128, 192, 256, 512)
DISCRETE_RESERVE = 0.05  # driver, CUDA context and display on a dedicated GPU


@dataclass(frozen=True)
class PlatformReadings:
    """What the computer reports, in bytes; `device_info` is `mx.device_info()`."""

    system_total: int
    system_used: int
    system_available: int
    backend: str  # "metal" | "cuda" | "cpu"
    device_info: dict = field(default_factory=dict)


def mlx_backend() -> str:
    import mlx.core as mx

    if mx.metal.is_available():
        return "metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    return "cpu"


def read_platform() -> PlatformReadings:
    import mlx.core as mx
    import psutil

    vm = psutil.virtual_memory()
    backend = mlx_backend()
    info = dict(mx.device_info()) if hasattr(mx, "device_info") else {}
    return PlatformReadings(
        system_total=vm.total,
        system_used=vm.total - vm.available,
        system_available=vm.available,
        backend=backend,
        device_info=info,
    )


@dataclass(frozen=True)
class Machine:
    total_bytes: int
    used_bytes: int
    available_bytes: int
    reserve_bytes: int
    usable_bytes: int
    backend: str
    unified: bool
    device_name: str = ""
    recommended_working_set_bytes: int | None = None
    hypothetical: bool = False
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "available_bytes": self.available_bytes,
            "reserve_bytes": self.reserve_bytes,
            "usable_bytes": self.usable_bytes,
            "backend": self.backend,
            "unified": self.unified,
            "device_name": self.device_name,
            "recommended_working_set_bytes": self.recommended_working_set_bytes,
            "hypothetical": self.hypothetical,
            "warnings": list(self.warnings),
        }


def parse_reserve(text: str) -> float | int:
    """'0.25' or '25%' -> a fraction of total; '8GB' -> bytes."""
    text = str(text).strip()
    try:
        if text.endswith("%"):
            fraction = float(text[:-1]) / 100
        else:
            fraction = float(text)
    except ValueError:
        return parse_bytes(text)
    if not 0 <= fraction < 1:
        raise BadInput(f"reserve must be a fraction in [0, 1) or a size, got {text!r}")
    return fraction


def _reserve_bytes(total: int, reserve: float | int | None, default: float) -> int:
    if reserve is None:
        reserve = default
    if isinstance(reserve, float):
        return int(total * reserve)
    if reserve >= total:
        raise BadInput(
            f"reserve of {format_gb(reserve)} leaves nothing of {format_gb(total)}"
        )
    return int(reserve)


def build_machine(
    readings: PlatformReadings,
    reserve: float | int | None = None,
    memory: int | None = None,
    gpu_memory: int | None = None,
) -> Machine:
    """Turn readings (or a hypothetical size) into a budget for training.

    `memory` replaces the machine with a unified-memory one of that size;
    `gpu_memory` with a discrete GPU of that size. Neither reads current use.
    """
    if memory is not None and gpu_memory is not None:
        raise BadInput("give --memory (unified) or --gpu-memory (discrete GPU), not both")
    if memory is not None or gpu_memory is not None:
        unified = memory is not None
        total = memory if unified else gpu_memory
        reserve_b = _reserve_bytes(
            total, reserve, UNIFIED_RESERVE if unified else DISCRETE_RESERVE
        )
        backend = "metal" if unified else "cuda"  # the machines these stand for
        warnings = ()
        if unified and total % GB == 0 and total // GB in APPLE_MEMORY_SIZES:
            size = total // GB
            warnings = (
                f"Macs sold as {size}GB have {size} GiB ({format_gb(size * GiB)}): "
                f"give {size}GiB to plan for all of it",
            )
        return Machine(
            total_bytes=total,
            used_bytes=0,
            available_bytes=total,
            reserve_bytes=reserve_b,
            usable_bytes=total - reserve_b,
            backend=backend,
            unified=unified,
            device_name="hypothetical",
            hypothetical=True,
            warnings=warnings,
        )

    info = readings.device_info
    warnings: list[str] = []
    if readings.backend == "cuda":
        # The GPU's own memory is the limit; the computer's RAM does not count.
        total = int(info.get("total_memory") or info.get("memory_size") or 0)
        if not total:
            raise BadInput("the CUDA backend reported no GPU memory size")
        free = int(info.get("free_memory", total))
        used = total - free
        reserve_b = _reserve_bytes(total, reserve, DISCRETE_RESERVE)
        unified = False
        recommended = None
    else:
        total = int(info.get("memory_size") or readings.system_total)
        used = readings.system_used
        free = readings.system_available
        reserve_b = _reserve_bytes(total, reserve, UNIFIED_RESERVE)
        unified = True
        recommended = info.get("max_recommended_working_set_size")
        recommended = int(recommended) if recommended else None

    usable = total - reserve_b
    if used > reserve_b:
        warnings.append(
            f"other programs already use {format_gb(used)}, more than the "
            f"{format_gb(reserve_b)} reserve: only {format_gb(free)} is free right now, "
            f"less than the {format_gb(usable)} budget"
        )
    if recommended is not None and usable > recommended:
        warnings.append(
            f"the {format_gb(usable)} budget exceeds Metal's recommended working set "
            f"({format_gb(recommended)}); mlx-lm wires at most that much"
        )
    return Machine(
        total_bytes=total,
        used_bytes=used,
        available_bytes=free,
        reserve_bytes=reserve_b,
        usable_bytes=usable,
        backend=readings.backend,
        unified=unified,
        device_name=str(info.get("device_name") or info.get("architecture") or ""),
        recommended_working_set_bytes=recommended,
        warnings=tuple(warnings),
    )
