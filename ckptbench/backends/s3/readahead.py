"""Reads served from ranged GETs issued ahead of the reader.

The runner reads a file in blocks (``--block-size``, 8 MiB by default) and a restore plan
chunk by chunk (many chunks under 1 MiB), one call at a time per thread: one request per
read would keep one request in flight per thread, too few to reach a store's bandwidth. A
handle here keeps up to ``depth`` ranged GETs of at most ``chunk`` bytes in flight ahead of
the reader and copies each read out of them (one copy, which overlaps the transfers).

* **Planned** (``plan``: the (offset, length) of every read to come, in order, as a restore
  plan knows them and as DCP hands its storage reader all of a file's reads at once): the
  GETs are the planned spans, those that follow on merged and cut into ``chunk``-byte
  GETs; scattered small reads are as many small GETs. The planned handles one thread
  opens share a :class:`Lane`: ``depth`` GETs in flight, and up to ``SMALL_PER_LARGE``
  times as many small ones running (a GET of a few bytes waits on latency, not
  bandwidth; once done it waits for the reader without holding a place). A
  handle issues its own next GETs first; the reader's next file (:meth:`ReadAhead.prefetch`)
  gets the places a file leaves once its GETs are all issued
  in the lane's free places, so a rank's bandwidth does not drain at each file's end;
  its small GETs, which need no large place, start at once.
* **Unplanned**: sequential reads stream ``chunk``-byte GETs to the object's end (the
  first GET learns the object's size, so no request goes past it). A read that is not
  where the last one ended starts afresh there with one GET of just what it asks, and
  read-ahead resumes when the next read follows on.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from ckptbench.backends.base import ReadHandle

_HOLDERS = threading.Lock()


@dataclass
class Chunk:
    """What one ranged GET brought: `data` (its first `n` bytes are the object's bytes
    from the GET's start), the object's size, and how to give the memory back: `release`,
    called once the handle is done with it and every view lent from it is given back."""

    data: Any  # a buffer (bytearray, memoryview, obstore.Bytes)
    n: int
    total: int
    release: Callable[[], None] = lambda: None
    holders: int = 1  # the handle, and each view lent out (ReadAhead.borrow)

    def hold(self) -> None:
        with _HOLDERS:
            self.holders += 1

    def drop(self) -> None:
        with _HOLDERS:
            self.holders -= 1
            last = self.holders == 0
        if last:
            self.release()


Fetch = Callable[[int, int], "Future[Chunk]"]  # (offset, length) -> the GET in flight


Span = tuple[int, int]  # (offset, length)


def plan_gets(spans: Sequence[Span], chunk: int, ramp: bool = False) -> list[Span]:
    """The GETs for planned reads: runs of spans that follow on (or overlap the run's end)
    as one stream cut into `chunk`-byte GETs, any other span a GET (or several) of its own.
    `ramp`: the first run longer than a small GET starts with GETs of `chunk >> RAMP`
    bytes, doubling up to `chunk` (see RAMP)."""
    runs: list[list[int]] = []
    for off, n in spans:
        if n <= 0:
            continue
        if runs and runs[-1][0] <= off <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], off + n)
        else:
            runs.append([off, off + n])
    out: list[Span] = []
    for start, end in runs:
        size = chunk
        if ramp and end - start > SMALL_GET:
            ramp, size = False, chunk >> RAMP
            while size <= SMALL_GET:
                size *= 2
            size = min(size, chunk)
        s = start
        while s < end:
            out.append((s, min(size, end - s)))
            s += size
            size = min(2 * size, chunk)
    return out


SMALL_GET = 1 << 20  # a planned GET of at most this many bytes is small: ...
SMALL_PER_LARGE = 4  # ... a lane runs this many per large one, ...
SMALL_QUEUED = 256  # ... and holds at most this many, done or not, ...
SMALL_HELD = 16 << 20  # ... and this many bytes of them (what their buffers take)
LARGE_HELD = 2  # a lane holds at most this many large GETs per place, done or not
# A reader thread that starts with no GET in flight (its first file) ramps up: its first
# GETs are chunk/16, /8, /4, /2 (4, 8, 16, 32 MiB on the botocore path), then whole
# chunks. Its `depth` first GETs share the bandwidth and the reader needs the first one
# whole: all of 64 MiB had kept a fresh restore's first read waiting on 4 x 64 MiB per
# rank (2-2.3 s of a 6 s restore on a loaded 2-core machine), its verification idle.
RAMP = 4


class Lane:
    """The planned GETs of one reader thread's open handles, whichever file they read: at
    most `depth` large ones in flight, and once done they wait for the reader without
    holding a place, up to `LARGE_HELD * depth` in all (concurrent GETs finish in any
    order: a done GET holding its place while the reader waits on an earlier one had
    left the rank with fewer requests in flight than chosen, and the store idle between
    waves); small ones (a few bytes wait on latency, not bandwidth) `SMALL_PER_LARGE *
    depth` running, and once done they wait without holding a place, up to SMALL_QUEUED
    and SMALL_HELD bytes. Used by the thread that opened the handles only (no lock); a
    handle dropped unclosed leaves it."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.handles: weakref.WeakSet[ReadAhead] = weakref.WeakSet()

    def room(self, n: int, ahead: bool = False) -> bool:
        """Whether a GET of `n` bytes may start; `ahead` (a file the reader has not reached)
        may run only half the small places, so the current file's small reads keep theirs."""
        if n > SMALL_GET:
            large = [x[2] for h in self.handles for x in h.queue if x[1] > SMALL_GET]
            return (len(large) < LARGE_HELD * self.depth
                    and sum(1 for f in large if not f.done()) < self.depth)
        held = [x for h in self.handles for x in h.queue if x[1] <= SMALL_GET]
        if len(held) >= SMALL_QUEUED or sum(x[1] for x in held) + n > SMALL_HELD:
            return False
        running = sum(1 for x in held if not x[2].done())
        return running < SMALL_PER_LARGE * self.depth // (2 if ahead else 1)


_lanes = threading.local()


def thread_lane(depth: int) -> Lane:
    """The calling thread's lane (a new one where its depth differs)."""
    lane: Lane | None = getattr(_lanes, "lane", None)
    if lane is None or lane.depth != depth:
        lane = _lanes.lane = Lane(depth)
    return lane


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
        self.lane = thread_lane(self.depth) if plan is not None else None
        idle = self.lane is not None and not any(h.queue for h in self.lane.handles)
        self.plan = (collections.deque(plan_gets(plan, chunk, ramp=idle))
                     if plan is not None else None)
        self.reads_ahead = plan is not None
        self.in_flight = [0, 0]  # planned GETs in the queue: [large, small]
        if self.lane is not None:
            self.lane.handles.add(self)
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
            chunk = self._await(fut, end)  # a BackendError of the GET is raised here
            if self.total is None:
                self.total = chunk.total
                self._fill(end)
            i = at - start
            n = min(chunk.n - i, len(view) - got)
            if n > 0:
                view[got:got + n] = memoryview(chunk.data)[i:i + n]
                got += n
            if n <= 0 or i + n >= chunk.n:
                self._pop()
                chunk.drop()
                if (self.plan is None and chunk.n < length
                        and start + chunk.n < (self.total or 0)):
                    self._restart(start + chunk.n)  # a short GET mid-object: go on from there
                if n <= 0 and self.plan is not None:
                    break  # the object ends inside this GET
        if self.plan is not None:
            self._fill(end)  # the places this read freed: its file's next GETs first
        self.pos = offset + got
        return got

    def borrow(self, offset: int, n: int) -> tuple[memoryview, Callable[[], None]] | None:
        """Planned: the `n` bytes at `offset` as a view of the GET that holds them, and the
        call that gives it back (no copy); None where no one GET of the plan holds them
        all (the caller reads them with readinto)."""
        if self.plan is None or n <= 0:
            return None
        self._skip_to(offset)
        self._fill(offset + n)
        if not self.queue or self.queue[0][0] > offset:
            return None
        start, _, fut = self.queue[0]
        chunk = self._await(fut, offset + n)  # a BackendError of the GET is raised here
        self.total = chunk.total if self.total is None else self.total
        i = offset - start
        if i + n > chunk.n:
            return None
        chunk.hold()
        if i + n == chunk.n:
            self._pop()
            chunk.drop()
            self._fill(offset + n)
        self.pos = offset + n
        return memoryview(chunk.data)[i:i + n], chunk.drop

    def _await(self, fut: Future[Chunk], end: int) -> Chunk:
        """Planned: the GET `fut`'s chunk; while it runs, each GET of the lane that
        finishes gives its place to the plan's next one at once (not when the reader
        reaches it)."""
        while self.plan is not None and not fut.done():
            running = [x[2] for x in self.queue if not x[2].done()]
            if len(running) < 2:
                break
            wait(running, timeout=0.05, return_when=FIRST_COMPLETED)
            self._fill(end)
            with contextlib.suppress(TimeoutError):
                return fut.result(timeout=0)  # a future done only when asked, as well
        return fut.result()

    def _one_off(self, at: int, view: memoryview) -> int:
        chunk = self.fetch(at, len(view)).result()
        n = min(chunk.n, len(view))
        view[:n] = memoryview(chunk.data)[:n]
        chunk.drop()
        return n

    def prefetch(self) -> None:
        """Planned: issue the plan's next GETs, as the lane has room for a file ahead."""
        if self.plan is not None:
            self._fill(0, ahead=True)

    def _pop(self) -> tuple[int, int, Future[Chunk]]:
        item = self.queue.popleft()
        if self.lane is not None:
            self.in_flight[item[1] <= SMALL_GET] -= 1
        return item

    def _skip_to(self, at: int) -> None:
        """Planned: drop the GETs (in flight or to come) that end before `at`."""
        assert self.plan is not None
        while self.queue and self.queue[0][0] + self.queue[0][1] <= at:
            _, _, fut = self._pop()
            fut.add_done_callback(_release_when_done)
        while not self.queue and self.plan and self.plan[0][0] + self.plan[0][1] <= at:
            self.plan.popleft()

    def _restart(self, offset: int) -> None:
        self._drop()
        self.pos = self.next_fetch = offset

    def _fill(self, end: int, ahead: bool = False) -> None:
        """GETs in flight: planned, the next ones of the plan as the reader thread's lane
        has room (`ahead`: for a file the reader has not reached). Unplanned, one until the object's size is known, then up to `depth`: ranges ahead
        to the object's end while reads follow on; after a jump, only up to `end`, the end
        of what this read asks for."""
        if self.plan is not None:
            assert self.lane is not None
            while self.plan and self.lane.room(self.plan[0][1], ahead):
                off, n = self.plan.popleft()
                self.in_flight[n <= SMALL_GET] += 1
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
            _, _, fut = self._pop()
            fut.add_done_callback(_release_when_done)

    def close(self) -> None:
        self._drop()
        if self.direct is not None:
            self.direct.close()


def _release_when_done(fut: Future[Chunk]) -> None:
    if not fut.cancelled() and fut.exception() is None:
        fut.result().drop()
