"""The producer/consumer handoff every format uses between the thread that makes bytes
(payload generation, reading) and the thread that consumes them (writing, verifying).

Two bounds, one shape: :class:`BufferRing` hands out a fixed ring of page-aligned buffers
(O_DIRECT needs alignment; a fixed ring bounds memory whatever the checkpoint size), and
:class:`ByteBudget` bounds the bytes in flight when items are arrays of varying size
(zarr chunks). Both signal ``primed`` once the producer has filled what it may before the
consumer starts, so the clock starts with the first payload ready.
"""

from __future__ import annotations

import mmap
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
POLL_S = 0.1


def aligned_buffer(nbytes: int) -> np.ndarray:
    """Page-aligned memory (mmap), as O_DIRECT needs; np.empty is not aligned. Private:
    Python's default, MAP_SHARED, is shmem, whose pages cost a quarter more to fault in."""
    mm = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(mm, dtype=np.uint8)


def assign_threads(items: Sequence[T], threads: int, size: Callable[[T], int]) -> list[list[T]]:
    """Largest item first to the least-loaded thread; each thread keeps the items' order."""
    loads = [0] * threads
    out: list[list[tuple[int, T]]] = [[] for _ in range(threads)]
    for i in sorted(range(len(items)), key=lambda i: -size(items[i])):
        t = min(range(threads), key=loads.__getitem__)
        out[t].append((i, items[i]))
        loads[t] += size(items[i])
    return [[item for _, item in sorted(lst, key=lambda p: p[0])] for lst in out]


class Handoff:
    """Items from one producer to one consumer; `stop` ends both sides early."""

    def __init__(self) -> None:
        self.full: queue.Queue[Any] = queue.Queue()
        self.stopped = threading.Event()
        self.primed = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def put(self, item: Any) -> None:
        self.full.put(item)

    def take(self) -> Any:
        """The next item; None at the end (the producer puts None) or once stopped."""
        while True:
            try:
                return self.full.get(timeout=POLL_S)
            except queue.Empty:
                if self.stopped.is_set():
                    return None


class BufferRing(Handoff):
    """A bounded ring of aligned buffers: the producer takes a free one, fills it and puts
    its index; the consumer gives it back."""

    def __init__(self, nbuf: int, size: int) -> None:
        super().__init__()
        self.buffers = [aligned_buffer(size) for _ in range(nbuf)]
        self.free: queue.Queue[int] = queue.Queue()
        for i in range(nbuf):
            self.free.put(i)

    def take_free(self) -> int | None:
        while not self.stopped.is_set():
            if self.free.empty():
                self.primed.set()
            try:
                return self.free.get(timeout=POLL_S)
            except queue.Empty:
                continue
        return None

    def give_back(self, i: int) -> None:
        self.free.put(i)

    def touch(self) -> None:
        """Fault every buffer's pages in now (off the clock)."""
        for buf in self.buffers:
            buf[::mmap.PAGESIZE] = 0


class ByteBudget(Handoff):
    """Items of varying size, at most `budget` bytes in flight (one item always fits)."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.used = 0
        self.cv = threading.Condition()

    def reserve(self, n: int) -> bool:
        with self.cv:
            while self.used and self.used + n > self.budget and not self.stopped.is_set():
                self.primed.set()
                self.cv.wait(POLL_S)
            self.used += n
            return not self.stopped.is_set()

    def release(self, n: int) -> None:
        with self.cv:
            self.used -= n
            self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            super().stop()
            self.cv.notify_all()
