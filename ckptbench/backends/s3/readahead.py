"""Sequential reads served from ranged GETs issued ahead of the reader, for transports
whose requests run outside Python (crt, obstore).

The runner reads a file in blocks (``--block-size``, 8 MiB by default), one call at a time
per thread: one request per block would keep one or two requests in flight per thread,
too few to reach a store's bandwidth. A handle here keeps up to ``depth`` ranged GETs of
``chunk`` bytes in flight ahead of the read position and copies each block out of them
(one copy, off the store's clock only in the sense that it overlaps the transfers). The
first GET of an object learns its size (Content-Range), so no request goes past the end.
A read that is not where the last one ended (a restore plan's reads skip what this rank
does not load) starts afresh there with one GET of just what it asks; read-ahead resumes
when the next read follows on, so scattered small reads never fetch whole ranges they drop.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ckptbench.backends.base import ReadHandle


@dataclass
class Chunk:
    """What one ranged GET brought: `data` (its first `n` bytes are the object's bytes
    from the GET's start), the object's size, and how to give the memory back."""

    data: Any  # a buffer (bytearray, memoryview, obstore.Bytes)
    n: int
    total: int
    release: Callable[[], None] = lambda: None


Fetch = Callable[[int, int], "Future[Chunk]"]  # (offset, length) -> the GET in flight


class ReadAhead(ReadHandle):
    """`direct`: a handle that reads straight into the caller's buffer, used (where given)
    for a read of at least a range that no GET in flight holds: no staging, no copy."""

    def __init__(self, fetch: Fetch, chunk: int, depth: int,
                 direct: ReadHandle | None = None) -> None:
        self.fetch = fetch
        self.direct = direct
        self.chunk = chunk
        self.depth = max(1, depth)
        self.queue: collections.deque[tuple[int, int, Future[Chunk]]] = collections.deque()
        self.pos = -1  # where the next sequential read starts
        self.next_fetch = 0
        self.total: int | None = None  # the object's size, once a GET said it
        self.streaming = False  # this read follows on from the last: ranges kept ahead

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B") if memoryview(buf).format != "B" else memoryview(buf)
        if self.direct is not None and len(view) >= self.chunk and not (
                self.queue and offset == self.pos):
            self._restart(offset)
            got = self.direct.readinto(offset, view)
            self.pos = self.next_fetch = offset + got
            return got
        self.streaming = offset == self.pos
        if not self.streaming:
            self._restart(offset)
        end = offset + len(view)
        got = 0
        while got < len(view):
            at = offset + got
            if self.total is not None and at >= self.total:
                break
            self._fill(end)
            start, length, fut = self.queue[0]
            chunk = fut.result()  # a BackendError of the GET is raised here
            if self.total is None:
                self.total = chunk.total
                self._fill(end)
            i = at - start
            n = min(chunk.n - i, len(view) - got)
            if n > 0:
                view[got:got + n] = memoryview(chunk.data)[i:i + n]
                got += n
            if n <= 0 or i + n >= chunk.n:
                self.queue.popleft()
                chunk.release()
                if chunk.n < length and start + chunk.n < (self.total or 0):
                    self._restart(start + chunk.n)  # a short GET mid-object: go on from there
        self.pos = offset + got
        return got

    def _restart(self, offset: int) -> None:
        self._drop()
        self.pos = self.next_fetch = offset

    def _fill(self, end: int) -> None:
        """GETs in flight (one until the object's size is known, then up to `depth`): ranges
        ahead to the object's end while reads follow on; after a jump, only up to `end`,
        the end of what this read asks for."""
        limit = 1 if self.total is None else self.depth
        if self.streaming:
            stop = self.total if self.total is not None else self.next_fetch + self.chunk
        else:
            stop = end if self.total is None else min(end, self.total)
        while len(self.queue) < limit and (self.next_fetch < stop or not self.queue):
            length = max(1, min(self.chunk, stop - self.next_fetch))
            self.queue.append((self.next_fetch, length, self.fetch(self.next_fetch, length)))
            self.next_fetch += length

    def _drop(self) -> None:
        while self.queue:
            _, _, fut = self.queue.popleft()
            fut.add_done_callback(_release_when_done)

    def close(self) -> None:
        self._drop()
        if self.direct is not None:
            self.direct.close()


def _release_when_done(fut: Future[Chunk]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().release()
