"""Fault injection for tests: wrapper backends a test passes to the runner in place of
the backend they wrap (any backend, a third party's included).

A wrapper forwards everything to the backend it wraps (:mod:`.forwarding`: every method
written out, typed) and breaks one thing on purpose, the way zarr's LatencyStore wraps a
store.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

from ckptbench.backends import Backend, WriteHandle
from ckptbench.backends.base import SharedFileWrites, unsupported
from ckptbench.testing.forwarding import ForwardingBackend, ForwardingWriteHandle


class _DieAfterBytes(ForwardingWriteHandle):
    """A write handle that ends the process (status 9) once the budget is written."""

    def __init__(self, inner: WriteHandle, budget: list[int]) -> None:
        super().__init__(inner)
        self._budget = budget

    def write(self, data: memoryview) -> None:
        self.inner.write(data)
        self._budget[0] -= len(data)
        if self._budget[0] <= 0:
            os._exit(9)


class DyingBackend(ForwardingBackend):
    """Writes to keys that `dies_on` selects count against a byte budget; the process
    writing the byte that exhausts it exits at once (a rank dying in the middle of a save)."""

    def __init__(self, inner: Backend, dies_on: Callable[[str], bool], after: int) -> None:
        super().__init__(inner)
        self._dies_on = dies_on
        self._budget = [after]

    def open_write(self, key: str, size: int) -> WriteHandle:
        handle = self.inner.open_write(key, size)
        return _DieAfterBytes(handle, self._budget) if self._dies_on(key) else handle

    def open_write_region(self, key: str, offset: int, size: int, file_size: int
                          ) -> WriteHandle:
        """The shared file's region (where inner has N-1 writes: else refused)."""
        if not isinstance(self.inner, SharedFileWrites):
            raise unsupported(self.inner, "one file written by several ranks")
        handle = self.inner.open_write_region(key, offset, size, file_size)
        return _DieAfterBytes(handle, self._budget) if self._dies_on(f"{key}@{offset}") else handle


class _PauseAfterBytes(ForwardingWriteHandle):
    """A write handle that, once the budget is written, creates the flag file and then
    blocks (a rank stuck in the middle of a save, for a signal or a node failure to end)."""

    def __init__(self, inner: WriteHandle, budget: list[int], flag: str) -> None:
        super().__init__(inner)
        self._budget, self._flag = budget, flag

    def write(self, data: memoryview) -> None:
        self.inner.write(data)
        self._budget[0] -= len(data)
        if self._budget[0] <= 0:
            with open(f"{self._flag}.{os.getpid()}", "x"):
                pass
            time.sleep(3600)


class PausingBackend(ForwardingBackend):
    """Writes to keys that `pauses_on` selects count against a byte budget; the write
    that exhausts it creates `flag`.PID and blocks for an hour (the test waits for the
    flag, then ends the run its own way)."""

    def __init__(self, inner: Backend, pauses_on: Callable[[str], bool], after: int,
                 flag: str) -> None:
        super().__init__(inner)
        self._pauses_on, self._budget, self._flag = pauses_on, [after], flag

    def open_write(self, key: str, size: int) -> WriteHandle:
        handle = self.inner.open_write(key, size)
        return _PauseAfterBytes(handle, self._budget, self._flag) if self._pauses_on(key) \
            else handle


class _FullAfterBytes(ForwardingWriteHandle):
    """A write handle whose writes fail with ENOSPC once the budget is spent."""

    def __init__(self, inner: WriteHandle, budget: list[int], key: str) -> None:
        super().__init__(inner)
        self._budget, self._key = budget, key

    def write(self, data: memoryview) -> None:
        if self._budget[0] - len(data) < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._key)
        self._budget[0] -= len(data)
        self.inner.write(data)


class FullDiskBackend(ForwardingBackend):
    """Writes to keys that `full_on` selects share a byte budget; the write that would
    exceed it fails with ENOSPC, as a file system that filled up says it."""

    def __init__(self, inner: Backend, full_on: Callable[[str], bool], after: int) -> None:
        super().__init__(inner)
        self._full_on = full_on
        self._budget = [after]

    def open_write(self, key: str, size: int) -> WriteHandle:
        handle = self.inner.open_write(key, size)
        return _FullAfterBytes(handle, self._budget, key) if self._full_on(key) else handle


class _SlowWrites(ForwardingWriteHandle):
    def __init__(self, inner: WriteHandle, delay: float) -> None:
        super().__init__(inner)
        self._delay = delay

    def write(self, data: memoryview) -> None:
        time.sleep(self._delay)
        self.inner.write(data)


class SlowBackend(ForwardingBackend):
    """Every write waits `delay` seconds first: a storage slower than the training step."""

    def __init__(self, inner: Backend, delay: float) -> None:
        super().__init__(inner)
        self._delay = delay

    def open_write(self, key: str, size: int) -> WriteHandle:
        return _SlowWrites(self.inner.open_write(key, size), self._delay)
