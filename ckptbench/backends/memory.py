"""The memory backend (``memory://NAME``): bytes kept in this process's memory.

A baseline with no storage below it: a save costs one copy of each block into memory, a
restore one copy out. Objects appear whole when ``sync`` returns, as on an object store.
Targets of the same NAME in one process share their objects (so tests can look at them).

One process only: the runner forks a process per rank, and what a forked process stores
stays in that process. A run whose ranks are in one process works: one rank (its process
saves, commits the manifest and restores), or all ranks in one MPI process. A run with more
processes is refused before it starts (``capabilities.multi_process`` is False). Memory is
what a checkpoint's ranks in that process write: use it for small plans (``--scale``,
``--ranks``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from ckptbench.backends.base import (
    TARGET_MARKER,
    Backend,
    Capabilities,
    ReadHandle,
    WriteHandle,
    foreign_target_error,
    marker_bytes,
)
from ckptbench.backends.options import BackendOptions, IOHints
from ckptbench.errors import BackendError

STORES: dict[str, dict[str, bytes | bytearray]] = {}  # NAME -> key -> bytes, in this process
_LOCK = threading.Lock()


class _Writer(WriteHandle):
    """A new object (or, with `region`, a region of a shared one) filled in order."""

    def __init__(self, backend: MemoryBackend, key: str, size: int,
                 region: tuple[bytearray, int] | None = None) -> None:
        self.backend, self.key, self.size = backend, key, size
        self.region = region
        self.buf = bytearray(size) if region is None else region[0]
        self.base = 0 if region is None else region[1]
        self.written = 0

    def write(self, data: memoryview) -> None:
        n = min(len(data), self.size - self.written)  # never past the object's size
        start = self.base + self.written
        self.buf[start:start + n] = memoryview(data).cast("B")[:n]
        self.written += n

    def sync(self) -> None:
        if self.region is None:
            self.backend.store_object(self.key, bytes(self.buf[:self.written]))

    def close(self) -> None:
        pass


class _Reader(ReadHandle):
    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B")
        piece = memoryview(self.data)[offset:offset + len(view)]
        view[:len(piece)] = piece
        return len(piece)

    def close(self) -> None:
        pass


class MemoryBackend(Backend):
    name = "memory"
    capabilities: ClassVar[Capabilities] = Capabilities(multi_process=False)

    def __init__(self, target: str, options: BackendOptions | None = None,
                 hints: IOHints | None = None) -> None:
        super().__init__(target, options, hints)
        self.store_name = target.removeprefix("memory://").strip("/")
        if not target.startswith("memory://") or not self.store_name:
            raise BackendError(f"target {target}: allowed: memory://NAME")
        self.created_marker = False

    @property
    def objects(self) -> dict[str, bytes | bytearray]:
        with _LOCK:
            return STORES.setdefault(self.store_name, {})

    def store_object(self, key: str, data: bytes | bytearray) -> None:
        with _LOCK:
            STORES.setdefault(self.store_name, {})[key] = data

    # --- the target ---
    def prepare(self) -> None:
        objects = self.objects
        if TARGET_MARKER in objects:
            return
        if objects:
            raise foreign_target_error(self.target, sorted(objects)[0])
        self.store_object(TARGET_MARKER, marker_bytes())
        self.created_marker = True

    def release(self) -> None:
        with _LOCK:
            objects = STORES.get(self.store_name, {})
            if self.created_marker and set(objects) <= {TARGET_MARKER}:
                STORES.pop(self.store_name, None)
                self.created_marker = False

    # --- data ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        if key in self.objects:
            raise BackendError(f"{self.target}/{key}: already exists (ckptbench never overwrites)")
        return _Writer(self, key, size)

    def create_shared(self, key: str, size: int) -> None:
        if key in self.objects:
            raise BackendError(f"{self.target}/{key}: already exists (ckptbench never overwrites)")
        self.store_object(key, bytearray(size))

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> WriteHandle:
        shared = self.objects.get(key)
        if not isinstance(shared, bytearray) or len(shared) != file_size:
            raise BackendError(f"{self.target}/{key}: no shared object of {file_size} bytes")
        return _Writer(self, key, size, region=(shared, offset))

    def open_read(self, key: str) -> ReadHandle:
        try:
            return _Reader(self.objects[key])
        except KeyError:
            raise BackendError(f"{self.target}/{key}: not found") from None

    def put_atomic(self, key: str, data: bytes | memoryview) -> None:
        self.store_object(key, bytes(data))

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.objects[key])
        except KeyError:
            raise FileNotFoundError(f"{self.target}/{key}") from None

    def exists(self, key: str) -> bool:
        return key in self.objects

    def remove_tree(self, prefix: str) -> None:
        base = prefix.strip("/")
        if not base or base == TARGET_MARKER:
            raise BackendError(f"{self.target}: refusing to remove the whole target")
        with _LOCK:
            objects = STORES.get(self.store_name, {})
            for key in [k for k in objects if k == base or k.startswith(base + "/")]:
                del objects[key]

    # --- what a run made, by name ---
    def delete(self, keys: Sequence[str]) -> None:
        with _LOCK:
            objects = STORES.get(self.store_name, {})
            for key in keys:
                objects.pop(key, None)

    def list_names(self, prefix: str, limit: int) -> list[str]:
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""  # "": the whole target
        return sorted(k for k in self.objects if k.startswith(base))[:limit]

    def details(self) -> dict[str, Any]:
        return {"kept": "in this process's memory (one process: one rank or one MPI process)",
                "objects": len(self.objects)}
