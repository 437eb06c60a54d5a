"""The null backend (``null://``, ``null://NAME``): the harness's own ceiling for saves.

Every write is counted and dropped: no copy, no system call, no storage. A save measured
on ``null://`` is what ckptbench itself can drive (payload generation, the buffer ring,
threads, the clock, the manifest), so a storage number is only meaningful well below it;
the comparisons print it next to every result.

Restores are refused before a run starts (``--no-restore`` is required): nothing was kept,
and serving made-up bytes would fail verification by design. Small objects written whole
(the manifest, with ``put_atomic``) are kept in this process, so the commit protocol runs
as on any store: their first MiB (a manifest's JSON line; the rest, padding to the size of
DCP's ``.metadata``, is counted and dropped like any write); under MPI on several nodes the runner's shared-target probe cannot see
them, so use one node.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from ckptbench.backends.base import Backend, Capabilities, ReadHandle, WriteHandle
from ckptbench.backends.options import BackendOptions, IOHints
from ckptbench.errors import BackendError

KEPT = 1 << 20  # bytes of a small object kept (a manifest's JSON line)


class _Counter(WriteHandle):
    def __init__(self, backend: NullBackend) -> None:
        self.backend = backend

    def write(self, data: memoryview) -> None:
        self.backend.count(len(data))

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class NullBackend(Backend):
    name = "null"
    capabilities: ClassVar[Capabilities] = Capabilities(restore=False)

    def __init__(self, target: str, options: BackendOptions | None = None,
                 hints: IOHints | None = None) -> None:
        super().__init__(target, options, hints)
        if not self.target.startswith("null://"):
            raise BackendError(f"target {self.target}: not a null:// URL; allowed: null://[NAME]")
        self._lock = threading.Lock()
        self._counts = {"writes": 0, "bytes_discarded": 0}
        self._small: dict[str, bytes] = {}

    def count(self, nbytes: int) -> None:
        with self._lock:
            self._counts["writes"] += 1
            self._counts["bytes_discarded"] += nbytes

    # --- the target: there is none ---
    def prepare(self) -> None:
        pass

    def release(self) -> None:
        self._small.clear()

    # --- data: counted, then dropped ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        return _Counter(self)

    def create_shared(self, key: str, size: int) -> None:
        pass

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> WriteHandle:
        return _Counter(self)

    def open_read(self, key: str) -> ReadHandle:
        raise BackendError(f"{self.target}: read {key}: the null backend keeps nothing to read; "
                           "allowed: --no-restore")

    def put_atomic(self, key: str, data: bytes | memoryview) -> None:
        self._small[key] = bytes(data[:KEPT])

    def get(self, key: str) -> bytes:
        try:
            return self._small[key]
        except KeyError:
            raise FileNotFoundError(f"{self.target}/{key}") from None

    def exists(self, key: str) -> bool:
        return key in self._small

    def remove_tree(self, prefix: str) -> None:
        base = prefix.strip("/")
        for key in [k for k in self._small if k == base or k.startswith(base + "/")]:
            del self._small[key]

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._small.pop(key, None)

    def list_names(self, prefix: str, limit: int) -> list[str]:
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""  # "": the whole target
        return sorted(k for k in self._small if k.startswith(base))[:limit]

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
            self._counts = dict.fromkeys(out, 0)
        return out

    def details(self) -> dict[str, Any]:
        return {"kept": "nothing: writes are counted and dropped (the harness's save ceiling)"}
