"""Files written whole or not at all: beside the target, then renamed over it.

A full disk or a kill while writing leaves the file as it was before (or absent),
never half-written; the temporary file is removed on failure.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomically(path, write: Callable[[BinaryIO], None]) -> Path:
    """Call `write` on a temporary file in `path`'s folder, then rename it to `path`.
    A new file gets the usual permissions (0666 less the umask); a replaced one keeps its own."""
    target = Path(path)
    folder = target.resolve().parent
    with tempfile.NamedTemporaryFile("wb", dir=folder, prefix=f".{target.name}.", suffix=".tmp", delete=False) as tmp:
        try:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        except BaseException:
            tmp.close()
            os.unlink(tmp.name)
            raise
    try:
        os.chmod(tmp.name, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask())
        os.replace(tmp.name, target)
    except BaseException:
        os.unlink(tmp.name)
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
