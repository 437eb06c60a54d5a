"""Reads served from ranged GETs issued ahead of the reader.

The runner reads a file in blocks (``--block-size``, 8 MiB by default) and a restore plan
chunk by chunk (many chunks under 1 MiB), one call at a time per thread: one request per
read would keep one request in flight per thread, too few to reach a store's bandwidth. A
handle here keeps up to ``depth`` ranged GETs of at most ``chunk`` bytes in flight ahead of
the reader and copies each read out of them (one copy, which overlaps the transfers).

* **Planned** (``plan``: the (offset, length) of every read to come, in order, as a restore
  plan knows them and as DCP hands its storage reader all of a file's reads at once): the
  GETs are the planned spans, those that follow on merged and cut into ``chunk``-byte
  GETs; scattered small reads are as many small GETs, ``depth`` of them in flight.
* **Unplanned**: sequential reads stream ``chunk``-byte GETs to the object's end (the
  first GET learns the object's size, so no request goes past it). A read that is not
  where the last one ended starts afresh there with one GET of just what it asks, and
  read-ahead resumes when the next read follows on.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
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


Span = tuple[int, int]  # (offset, length)


def plan_gets(spans: Sequence[Span], chunk: int) -> list[Span]:
    """The GETs for planned reads: runs of spans that follow on (or overlap the run's end)
    as one stream cut into `chunk`-byte GETs, any other span a GET (or several) of its own."""
    runs: list[list[int]] = []
    for off, n in spans:
        if n <= 0:
            continue
        if runs and runs[-1][0] <= off <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], off + n)
        else:
            runs.append([off, off + n])
    return [(s, min(chunk, end - s)) for start, end in runs for s in range(start, end, chunk)]


class ReadAhead(ReadHandle):
    """`direct`: a handle that reads straight into the caller's buffer, used (unplanned,
    where given) for a read of at least `direct_min` bytes (default: a range) that no GET
    in flight holds: no copy. `plan`: the reads to come (see the module's docstring)."""

    def __init__(self, fetch: Fetch, chunk: int, depth: int,
                 direct: ReadHandle | None = None, plan: Sequence[Span] | None = None,
                 direct_min: int | None = None) -> None:
        self.fetch = fetch
        self.direct = direct
        self.direct_min = chunk if direct_min is None else direct_min
        self.chunk = chunk
        self.depth = max(1, depth)
        self.queue: collections.deque[tuple[int, int, Future[Chunk]]] = collections.deque()
        self.plan = collections.deque(plan_gets(plan, chunk)) if plan is not None else None
        self.pos = -1  # where the next sequential read starts
        self.next_fetch = 0
        self.total: int | None = None  # the object's size, once a GET said it
        self.streaming = False  # this read follows on from the last: ranges kept ahead

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B") if memoryview(buf).format != "B" else memoryview(buf)
        if self.plan is None:
            if self.direct is not None and len(view) >= self.direct_min and not (
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
            if self.plan is not None:
                self._skip_to(at)
            self._fill(end)
            if not self.queue or self.queue[0][0] > at:  # a read the plan did not name
                got += self._one_off(at, view[got:])
                break
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
                if (self.plan is None and chunk.n < length
                        and start + chunk.n < (self.total or 0)):
                    self._restart(start + chunk.n)  # a short GET mid-object: go on from there
                if n <= 0 and self.plan is not None:
                    break  # the object ends inside this GET
        self.pos = offset + got
        return got

    def _one_off(self, at: int, view: memoryview) -> int:
        chunk = self.fetch(at, len(view)).result()
        n = min(chunk.n, len(view))
        view[:n] = memoryview(chunk.data)[:n]
        chunk.release()
        return n

    def _skip_to(self, at: int) -> None:
        """Planned: drop the GETs (in flight or to come) that end before `at`."""
        assert self.plan is not None
        while self.queue and self.queue[0][0] + self.queue[0][1] <= at:
            _, _, fut = self.queue.popleft()
            fut.add_done_callback(_release_when_done)
        while not self.queue and self.plan and self.plan[0][0] + self.plan[0][1] <= at:
            self.plan.popleft()

    def _restart(self, offset: int) -> None:
        self._drop()
        self.pos = self.next_fetch = offset

    def _fill(self, end: int) -> None:
        """GETs in flight: planned, the next ones of the plan, `depth` at a time.
        Unplanned, one until the object's size is known, then up to `depth`: ranges ahead
        to the object's end while reads follow on; after a jump, only up to `end`, the end
        of what this read asks for."""
        if self.plan is not None:
            while len(self.queue) < self.depth and self.plan:
                off, n = self.plan.popleft()
                self.queue.append((off, n, self.fetch(off, n)))
            return
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
