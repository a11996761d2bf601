"""Files read as UTF-8 text or refused in one line, and files written whole or not
at all: beside the target, then renamed over it.

A full disk or a kill while writing leaves the file as it was before (or absent),
never half-written; the temporary file is removed on failure.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import MlxfitError


def read_text(path, what: str = "", error: type[MlxfitError] = MlxfitError) -> str:
    """The whole file as UTF-8 text (as mlx-lm and huggingface_hub read their files),
    or `error` in one line naming the file (`what` says which file it is) and the problem:
    missing, unreadable, a folder, a binary file, or text in another encoding."""
    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    try:
        with path.open("rb") as f:
            head = f.read(8192)
            if b"\0" in head:  # a weights file given as a config is refused before gigabytes are read
                raise error(f"{name} is a binary file, not UTF-8 text")
            data = head + f.read()
    except OSError as e:
        raise error(f"cannot read {name}: {e.strerror or e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(not_utf8(name, data, e.start)) from None


def not_utf8(name: str, data: bytes, offset: int) -> str:
    """Why `data` (the file `name`) is not UTF-8, with the place of its first bad byte."""
    if b"\0" in data[:8192]:
        return f"{name} is a binary file, not UTF-8 text"
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"{name} is not UTF-8 text (byte 0x{data[offset]:02x} at line {line}, column {column}): save it as UTF-8"


def write_atomically(path, write: Callable[[BinaryIO], None]) -> Path:
    """Call `write` on a buffer, then write it to a temporary file in `path`'s folder and
    rename that to `path`. On an error (a full disk, a read-only folder) or Ctrl-C the
    temporary file is removed and `path` is left as it was.
    A new file gets the usual permissions (0666 less the umask); a replaced one keeps its own."""
    target = Path(path)
    folder = target.resolve().parent
    content = io.BytesIO()
    write(content)  # whole in memory first: an error there touches no file
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:  # a read-only folder: named as the file asked for, not the temporary
        raise OSError(e.errno, e.strerror, str(target)) from e
    try:
        try:
            data = content.getbuffer()
            while data:  # a full disk fails here, unbuffered, not later when the file is closed
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temporary, target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask())
        os.replace(temporary, target)
    except BaseException as e:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # removed already, or the folder itself went away
        if isinstance(e, OSError) and e.filename in (None, temporary):  # a full disk names no file
            raise OSError(e.errno, e.strerror, str(target)) from e
        raise
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
