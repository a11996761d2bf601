"""Byte sizes in and out. Internally everything is integer bytes.

Output uses decimal gigabytes (GB = 10^9 bytes), the unit of the source's rule of
thumb and of mlx-lm's own "peak_memory" report.
"""

import re

from .errors import BadInput

GB = 10**9
GiB = 2**30

_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3, "KB": 10**3, "KIB": 2**10,
    "M": 10**6, "MB": 10**6, "MIB": 2**20,
    "G": 10**9, "GB": 10**9, "GIB": 2**30,
    "T": 10**12, "TB": 10**12, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str, default_unit: str = "GB") -> int:
    """'36GB', '36 GiB', '512MB', '36' (default unit) -> bytes. Raises BadInput."""
    match = _SIZE.match(str(text))
    if not match:
        raise BadInput(f"not a memory size: {text!r} (try 36GB, 36GiB or 512MB)")
    number, unit = float(match.group(1)), (match.group(2) or default_unit).upper()
    if unit not in _UNITS:
        raise BadInput(f"unknown unit {match.group(2)!r} in {text!r} (use GB, GiB or MB)")
    size = int(round(number * _UNITS[unit]))
    if size <= 0:
        raise BadInput(f"memory size must be positive, got {text!r}")
    return size


def gb(n_bytes: float) -> float:
    return n_bytes / GB


def format_gb(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / GB:.{digits}f} GB"


def format_gb_range(n_bytes: float, low: float, high: float, digits: int = 1) -> str:
    """An estimate with its range: 8.5 GB (7.9–10.2)."""
    return f"{n_bytes / GB:.{digits}f} GB ({low / GB:.{digits}f}–{high / GB:.{digits}f})"


def format_size(n_bytes: float) -> str:
    """Decimal units that keep small figures readable: 153.2 MB, 1.23 GB."""
    if abs(n_bytes) < GB:
        return f"{n_bytes / 10**6:.1f} MB"
    return f"{n_bytes / GB:.2f} GB"


def format_count(n: int) -> str:
    """Parameter counts the way model cards write them: 7.62B, 494M."""
    if n >= 999.5 * 10**6:  # 999,885,952 is "1.00B", not "1000M"
        return f"{n / 1e9:.2f}B"
    if n >= 999.5 * 10**3:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K"


def format_operations(n: float) -> str:
    """Operation counts: 3.2 GFLOP, 1.4 TFLOP, 2.0 PFLOP."""
    for scale, unit in ((10**15, "PFLOP"), (10**12, "TFLOP"), (10**9, "GFLOP"), (10**6, "MFLOP")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} FLOP"


def format_seconds(s: float) -> str:
    """A duration to the unit a person reads it in: 40 s, 12 min, 3.1 h, 4.2 days."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
