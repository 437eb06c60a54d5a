"""Restores on the botocore path: ranged GETs issued ahead of the reader
(:mod:`.readahead`) on a thread pool, so that a rank keeps its requests in flight (chosen,
or ``--s3-concurrency``) whatever the size of its reads: a restore plan reads chunk by
chunk, many of them under 1 MiB. Each GET is the plain reader's (:class:`.reader.S3Reader`:
read from the socket straight into a staging buffer, cut bodies retried and counted); the
first also asks the object's size (HEAD), so no GET goes past the end. A read of at least
one range that no GET in flight holds goes straight into the caller's buffer (the plain
reader's parallel ranged GETs, no copy), as warp-shaped runs read whole objects.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from ckptbench.backends.base import ReadHandle
from ckptbench.backends.s3.readahead import Chunk, ReadAhead
from ckptbench.backends.s3.reader import S3Reader
from ckptbench.backends.s3.sizing import PART_RANGE
from ckptbench.errors import BackendError

if TYPE_CHECKING:
    from ckptbench.backends.s3.backend import S3Backend


class BotoReadAhead:
    """One per backend and process: the GET pool and spare staging buffers."""

    def __init__(self, backend: S3Backend) -> None:
        self.b = backend
        self.chunk = PART_RANGE[0]
        self.pool = ThreadPoolExecutor(backend.concurrency * backend.hints.threads,
                                       thread_name_prefix="ckptbench-s3-ahead")
        self.lock = threading.Lock()
        self.spare: list[bytearray] = []

    def open_read(self, key: str) -> ReadHandle:
        reader = S3Reader(self.b, key)
        size: list[int] = []

        def fetch(offset: int, length: int) -> Future[Chunk]:
            return self.pool.submit(self._get, reader, key, size, offset, length)

        return ReadAhead(fetch, self.chunk, self.b.concurrency, direct=reader)

    def _get(self, reader: S3Reader, key: str, size: list[int], offset: int,
             length: int) -> Chunk:
        if not size:
            size.append(self._size(key))
        buf = self._buffer(length)
        n = reader._range(offset, memoryview(buf)[:length]) if offset < size[0] else 0
        return Chunk(buf, n, size[0], lambda: self._give(buf))

    def _size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        with self.b.calls(f"read {key}"):
            try:
                head = self.b._client().head_object(Bucket=self.b.bucket, Key=self.b._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                    raise BackendError(f"{self.b.target}: read {key}: no such object") from None
                raise
        return int(head["ContentLength"])

    def _buffer(self, n: int) -> bytearray:
        with self.lock:
            if n <= self.chunk and self.spare:
                return self.spare.pop()
        return bytearray(max(n, self.chunk))

    def _give(self, buf: bytearray) -> None:
        with self.lock:
            if len(buf) == self.chunk and len(self.spare) < 2 * self.b.concurrency:
                self.spare.append(buf)


def boto_readahead(backend: S3Backend) -> BotoReadAhead:
    """This process's read-ahead for `backend` (made on first use, never across a fork)."""
    proc = backend.clients.proc()
    found = proc.clients.get("readahead:botocore")
    if found is None:
        with proc.lock:
            found = proc.clients.get("readahead:botocore")
            if found is None:
                found = proc.clients["readahead:botocore"] = BotoReadAhead(backend)
    return found
