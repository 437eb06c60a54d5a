"""What every storage backend offers: moving bytes by key, and nothing about models.

Keys are '/'-separated paths relative to the target. A backend never times itself or
prints: the runner owns the clock and wraps each call (open, write, sync, close, read).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ckptbench import __version__
from ckptbench.errors import BackendError

TARGET_MARKER = ".ckptbench-target"


class WriteHandle(ABC):
    """One file or object being written, in order, from offset 0."""

    @abstractmethod
    def write(self, data: memoryview) -> None:
        """Write all of `data` (for direct I/O: aligned; the final piece may be padded)."""

    @abstractmethod
    def sync(self) -> None:
        """Make everything written durable (fsync; completing a multipart upload)."""

    @abstractmethod
    def close(self) -> None: ...

    def abort(self) -> None:
        """Give up on a partial write; the runner removes the partial checkpoint."""
        self.close()


class ReadHandle(ABC):
    @abstractmethod
    def readinto(self, offset: int, buf: memoryview) -> int:
        """Read up to len(buf) bytes at `offset`; fewer only at the end of the file."""

    @abstractmethod
    def close(self) -> None: ...


class Backend(ABC):
    """A storage system reached through one target (a directory, a bucket prefix, a URL)."""

    name: ClassVar[str]
    # What the runner may rely on: "direct" (O_DIRECT), "fadvise", "drop_caches", ...
    capabilities: ClassVar[frozenset[str]] = frozenset()
    # Buffers handed to write/readinto must be aligned to this many bytes (direct I/O).
    alignment: int = 1

    def __init__(self, target: str, options: dict[str, Any] | None = None) -> None:
        self.target = target
        self.options = dict(options or {})

    # --- the target ---
    @abstractmethod
    def prepare(self) -> None:
        """Check the target is usable and ours (or new/empty, then mark it); else raise
        BackendError naming the target and what is allowed."""

    @abstractmethod
    def release(self) -> None:
        """Undo prepare(): remove the target marker (and the target) if ckptbench created
        the target and nothing else is left in it."""

    # --- data ---
    @abstractmethod
    def open_write(self, key: str, size: int) -> WriteHandle: ...

    @abstractmethod
    def open_read(self, key: str) -> ReadHandle: ...

    @abstractmethod
    def put_atomic(self, key: str, data: bytes) -> None:
        """Write a small object so that readers see all of it or nothing (the manifest)."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Read a small object whole; FileNotFoundError if absent."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def remove_tree(self, prefix: str) -> None:
        """Delete everything under `prefix` (a checkpoint ckptbench wrote)."""

    # TEMPORARY shim until the backends branch lands (same API)
    def check_run(self, shared_file: bool, restore: bool, processes: int) -> None:
        if shared_file and "shared-file" not in self.capabilities:
            raise BackendError(
                f"[checkpoint] files = 'shared' (one file written by all ranks) needs a file "
                f"system target; {self.target} is a {self.name} target; allowed there: "
                "dcp, per-rank, per-chunk")

    def create_shared(self, key: str, size: int) -> None:
        raise BackendError("unsupported")

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> WriteHandle:
        raise BackendError("unsupported")

    def set_striping(self, prefix: str, stripe_size: int, stripe_count: int) -> dict[str, Any]:
        return {"applied": False, "reason": f"not available for the {self.name} backend"}

    def drop_host_caches(self) -> bool:
        return False

    def drop_cache(self, keys: list[str]) -> str:
        """Keep restores from reading what the save left in a cache; say how."""
        return "none"

    def stats(self) -> dict[str, int]:
        """Counters since the last call (e.g. retried requests), then reset; recorded per rank."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What the results file should record about this target (never secrets)."""
        return {"backend": self.name, "target": self.target, "options": self.public_options()}

    def public_options(self) -> dict[str, Any]:
        return {k: v for k, v in self.options.items() if "secret" not in k and "key" not in k}


def marker_bytes() -> bytes:
    return json.dumps({"created_by": "ckptbench", "version": __version__,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode()


def foreign_target_error(target: str, example: str) -> BackendError:
    return BackendError(
        f"target {target} holds files not made by ckptbench (e.g. {example!r}); "
        "allowed: a new or empty directory, or one ckptbench marked before"
    )
