"""A measuring process ends with the command that started it, however that ends.

The parent (mlxfit/measure/parent.py) keeps the child's stdin open while it lives and
writes nothing after the request. When the parent ends, even by SIGKILL, which no
handler sees, the kernel closes its end, on Linux and macOS alike: the child reads end
of file. As a second line, the child also notices being handed to another parent (its
parent gone while something else held the pipe open). Either way it removes the
parent's temporary folder, which is its own working directory, and ends at once,
mid-step or not. (Linux's PR_SET_PDEATHSIG is not used: its signal would come in the
same instant as the end of file and kill the child before the folder is removed.)
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import sys
import threading

FOLDER = "MLXFIT_MEASURE_FOLDER"  # the parent's temporary folder, set in the child's environment
CHECK_EVERY_S = 1.0


def receive() -> dict:
    """The parent's request (the first line of stdin), with the watch started; a parent
    that ended before its request was whole leaves nothing to do."""
    folder = _own_folder()
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):
        _orphaned(folder)
    follow_parent(sys.stdin.fileno(), folder)
    return json.loads(line)


def follow_parent(fd: int, folder: str | None) -> threading.Thread:
    """Watch `fd` (stdin) and the parent in a daemon thread; when the parent is gone,
    remove `folder` and exit. The same check runs at exit, for a process that ends
    first another way (an event written to the parent's closed pipe raises)."""
    parent = os.getppid()

    def watch():
        while not _parent_gone(fd, parent, CHECK_EVERY_S):
            pass
        _orphaned(folder)

    atexit.register(lambda: _parent_gone(fd, parent, 0) and _orphaned(folder))
    thread = threading.Thread(target=watch, name="follow-parent", daemon=True)
    thread.start()
    return thread


def _parent_gone(fd: int, parent: int, wait: float) -> bool:
    """Has `fd` reached its end, or the process been handed to another parent, within `wait` s?"""
    try:
        ready, _, _ = select.select([fd], [], [], wait)
        if ready and not os.read(fd, 4096):
            return True  # end of file: the parent closed its end, or ended
    except OSError:
        return True
    return os.getppid() != parent


def _own_folder() -> str | None:
    """The folder named in FOLDER, if it is this process's working directory (a folder
    this process was not started in is never removed)."""
    folder = os.environ.get(FOLDER)
    try:
        return folder if folder and os.path.samefile(folder, os.getcwd()) else None
    except OSError:
        return None


def _orphaned(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(1)
