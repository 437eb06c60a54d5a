"""A zarr v3 Store over a ckptbench Backend: zarr's keys, ckptbench's bytes-moving path.

Writing through the backend keeps the zarr format on the same footing as the raw one:
the same client (local files or the S3 backend's boto3 client), the same durability
(every object is fsynced / its upload completed before the write counts), the same
O_DIRECT alignment rules. zarr reads through it with ordinary ``get`` calls.

The store counts the bytes it moves per key, so the engine can record stored (encoded)
bytes next to logical ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)

from ckptbench.errors import BackendError
from ckptbench.formats.base import round_up
from ckptbench.formats.pipeline import aligned_buffer

if TYPE_CHECKING:
    from zarr.core.buffer import Buffer, BufferPrototype

    from ckptbench.backends import Backend, ReadHandle

MAX_READ = 256 << 20  # bytes per readinto call (one preadv is capped near 2 GiB)


def _buffer(nbytes: int, alignment: int) -> np.ndarray:
    if alignment <= 1:
        return np.empty(max(nbytes, 1), dtype=np.uint8)
    return aligned_buffer(round_up(max(nbytes, 1), alignment))


class BackendStore(Store):
    supports_writes = True
    supports_deletes = False
    supports_listing = False
    supports_partial_writes = False

    def __init__(self, backend: Backend, block_size: int = 8 << 20, *, read_only: bool = False,
                 inline: bool = False) -> None:
        super().__init__(read_only=read_only)
        self.backend = backend
        # inline: answer on the calling event loop's thread (each caller runs a private
        # loop in its own worker thread); else hand blocking I/O to asyncio.to_thread.
        self.inline = inline
        self.alignment = max(1, backend.alignment)
        self.block = round_up(block_size, self.alignment)
        self.size_hints: dict[str, int] = {}
        self._read_bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BackendStore) and other.backend is self.backend

    def __hash__(self) -> int:
        return id(self.backend)

    def with_read_only(self, read_only: bool = False) -> BackendStore:
        store = BackendStore(self.backend, self.block, read_only=read_only, inline=self.inline)
        store.size_hints = self.size_hints
        store._read_bytes, store._lock = self._read_bytes, self._lock
        return store

    # --- byte accounting ---
    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._read_bytes[key] = self._read_bytes.get(key, 0) + n

    def take_read_bytes(self, keys: Iterable[str]) -> int:
        """Bytes read for `keys` since the last call (and forget them)."""
        with self._lock:
            return sum(self._read_bytes.pop(k, 0) for k in keys)

    # --- blocking I/O, in the calling thread ---
    def put(self, key: str, data: memoryview | list[memoryview]) -> int:
        """Write one whole object durably (open, write, sync, close); return its size."""
        return self.put_timed(key, data)[0]

    def put_timed(self, key: str, data: memoryview | list[memoryview]) -> tuple[int, int]:
        """put(), and the perf_counter_ns instant the writes ended (sync + close follow).
        `data` may come in parts, written back to back (no concatenation)."""
        parts = [data] if isinstance(data, memoryview) else data
        parts = [p.cast("B") if p.format != "B" or p.ndim != 1 else p for p in parts]
        n = sum(len(p) for p in parts)
        if self.alignment > 1 and n:  # direct I/O: one aligned, padded buffer
            buf = _buffer(n, self.alignment)
            pos = 0
            for p in parts:
                buf[pos:pos + len(p)] = np.frombuffer(p, dtype=np.uint8)
                pos += len(p)
            buf[n:] = 0
            parts = [buf.data]
        handle = self.backend.open_write(key, n)
        try:
            for p in parts:
                for off in range(0, len(p), self.block):
                    handle.write(p[off:off + self.block])
            written = time.perf_counter_ns()
            handle.sync()
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                handle.abort()
            raise
        handle.close()
        return n, written

    def _open_or_none(self, key: str) -> ReadHandle | None:
        """A read handle, or None when the object does not exist (zarr's 'missing')."""
        try:
            return self.backend.open_read(key)
        except (FileNotFoundError, BackendError):
            if not self.backend.exists(key):
                return None
            raise

    def read_all(self, key: str) -> np.ndarray | None:
        """The whole object (None when it does not exist)."""
        handle = self._open_or_none(key)
        if handle is None:
            return None
        try:
            cap = round_up(self.size_hints.get(key, 1 << 20) + self.alignment, self.alignment)
            buf = _buffer(cap, self.alignment)
            off = 0
            while True:
                if off == len(buf):
                    bigger = _buffer(2 * len(buf), self.alignment)
                    bigger[:off] = buf[:off]
                    buf = bigger
                want = min(len(buf) - off, MAX_READ)
                got = handle.readinto(off, buf.data[off:off + want])
                off += got
                if got < want:
                    break
        finally:
            handle.close()
        self._count(key, off)
        return buf[:off]

    def read_range(self, key: str, start: int, end: int) -> np.ndarray | None:
        a0 = start // self.alignment * self.alignment
        a1 = round_up(end, self.alignment)
        handle = self._open_or_none(key)
        if handle is None:
            return None
        try:
            buf = _buffer(a1 - a0, self.alignment)
            got = handle.readinto(a0, buf.data[:a1 - a0])
        finally:
            handle.close()
        out = buf[start - a0:max(start - a0, min(got, end - a0))]
        self._count(key, len(out))
        return out

    def _get_sync(self, key: str, byte_range: ByteRequest | None) -> np.ndarray | None:
        if isinstance(byte_range, RangeByteRequest):
            return self.read_range(key, byte_range.start, byte_range.end)
        data = self.read_all(key)
        if data is None or byte_range is None:
            return data
        if isinstance(byte_range, OffsetByteRequest):
            return data[byte_range.offset:]
        if isinstance(byte_range, SuffixByteRequest):
            return data[max(0, len(data) - byte_range.suffix):]
        raise TypeError(f"unexpected byte range {byte_range!r}")

    # --- the zarr Store interface ---
    async def get(self, key: str, prototype: BufferPrototype,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        if self.inline:
            data = self._get_sync(key, byte_range)
        else:
            data = await asyncio.to_thread(self._get_sync, key, byte_range)
        return None if data is None else prototype.buffer.from_array_like(data)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(k, prototype, r) for k, r in key_ranges]

    async def exists(self, key: str) -> bool:
        if self.inline:
            return self.backend.exists(key)
        return await asyncio.to_thread(self.backend.exists, key)

    async def set(self, key: str, value: Buffer) -> None:
        self._check_writable()
        if self.inline:
            self.put(key, memoryview(value.as_buffer_like()))
        else:
            await asyncio.to_thread(self.put, key, memoryview(value.as_buffer_like()))

    async def delete(self, key: str) -> None:
        raise NotImplementedError("ckptbench's zarr store never deletes single keys")

    async def _empty(self) -> AsyncIterator[str]:
        raise NotImplementedError("ckptbench's zarr store does not list keys")
        yield ""  # pragma: no cover - makes this an async generator

    def list(self) -> AsyncIterator[str]:
        return self._empty()

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        return self._empty()

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        return self._empty()

    def __repr__(self) -> str:
        return f"BackendStore({self.backend.name}:{self.backend.target})"

    def describe(self) -> dict[str, Any]:
        return {"store": "ckptbench-backend", "backend": self.backend.name}
