"""A GlusterFS client's mount seen from outside: whether a path is mounted, and whether
its client is connected to every brick (harness.gluster waits for both)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ckptbench.backends.filesystems import gluster_graph, gluster_private

__all__ = ["bricks_connected", "is_mounted"]


def is_mounted(path: Path) -> bool:
    real = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)
    return False


def bricks_connected(path: Path) -> bool:
    """Whether the client mounted at `path` is connected to every brick (each
    protocol/client translator of its active graph, from its .meta tree). A client that
    is used before it is may take a directory's layout with a hole in it (the brick not
    yet up) and keep it: with long attribute timeouts the kernel never asks again, and a
    mkdir whose name hashes into the hole fails with EIO."""
    try:
        clients = [t.name for t in gluster_graph(path) if t.type == "protocol/client"]
        return bool(clients) and all(gluster_private(path, name).get("connected") == "1"
                                     for name in clients)
    except (OSError, ValueError, KeyError):
        return False
