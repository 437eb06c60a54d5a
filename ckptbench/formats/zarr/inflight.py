"""Bookkeeping for the zarr engine's I/O in flight: futures, their failures, reused buffers.

Kept apart from the engine so that the engine reads as the save and restore it runs.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from ckptbench.formats.base import ThreadResult
from ckptbench.formats.common import ChunkTask
from ckptbench.formats.pipeline import ByteBudget


def by_nbytes(task: ChunkTask) -> int:
    return task.nbytes


class BufferPool:
    """Reusable generation buffers (fresh pages cost as much as the copy into them)."""

    KEEP = 64

    def __init__(self) -> None:
        self.free: list[np.ndarray] = []
        self.lock = threading.Lock()

    def get(self, n: int) -> np.ndarray:
        with self.lock:
            fits = [i for i, b in enumerate(self.free) if n <= len(b) <= 2 * n + 4096]
            if fits:
                return self.free.pop(min(fits, key=lambda i: len(self.free[i])))
        return np.empty(n, dtype=np.uint8)

    def put(self, buf: np.ndarray) -> None:
        with self.lock:
            self.free.append(buf)
            del self.free[:-self.KEEP]


def still_running(pending: list[Future[None]]) -> list[Future[None]]:
    """Raise the first failure among finished I/O futures; keep the unfinished ones."""
    for f in pending:
        failure = f.exception() if f.done() else None
        if failure is not None:
            raise failure
    return [f for f in pending if not f.done()]


def settle(pending: list[Future[None]], feed: ByteBudget, res: ThreadResult) -> None:
    """Wait for the I/O still in flight; its first failure is the thread's error."""
    for f in pending:
        failure = f.exception()
        if failure is not None and res.error is None:
            res.error = failure
            feed.stop()


class Countdown:
    """A future callback that runs `then` once `n` futures are done."""

    def __init__(self, n: int, then: Any) -> None:
        self.n = n
        self.then = then
        self.lock = threading.Lock()
        if n == 0:
            then()

    def __call__(self, _future: Any) -> None:
        with self.lock:
            self.n -= 1
            last = self.n == 0
        if last:
            self.then()
