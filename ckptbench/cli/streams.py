"""Standard streams made valid before ckptbench opens anything.

A shell's ``2>&-`` starts the process with fd 2 closed: Python then sets ``sys.stderr``
to None, and the first file ckptbench opens (the results file) gets fd 2, so every rank
started later inherits it as its stderr and writes its messages into the results. Each of
fds 0-2 that is closed is opened on /dev/null first (reading for 0, writing for 1 and 2),
as is one open the wrong way (a read-only fd 2), and a missing ``sys.stdin``/``sys.stdout``
/``sys.stderr`` is rebuilt on it: a closed stream then swallows what is written to it and
never changes the exit status.
"""

from __future__ import annotations

import fcntl
import io
import os
import sys

_NAMES = ("stdin", "stdout", "stderr")


def _usable(fd: int) -> bool:
    """Open, and open the right way: readable for 0, writable for 1 and 2 (a closed fd 2
    can come back as a read-only file: pyenv's shim, exec'd with fd 2 closed, holds
    itself open there)."""
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return mode != os.O_WRONLY if fd == 0 else mode != os.O_RDONLY


def ensure_standard_streams() -> None:
    for fd, name in enumerate(_NAMES):
        if not _usable(fd):
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            mode = "r" if fd == 0 else "w"
            stream = io.TextIOWrapper(io.FileIO(fd, mode, closefd=False),
                                      line_buffering=fd != 0, errors="backslashreplace")
            setattr(sys, name, stream)
