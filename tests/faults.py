"""Fault injection for tests: wrapper backends that tests pass in (never shipped code).

A wrapper forwards everything to the backend it wraps and breaks one thing on purpose,
the way zarr's LatencyStore wraps a store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ckptbench.backends import Backend, WriteHandle


class _DieAfterBytes:
    """A write handle that ends the process (status 9) once the budget is written."""

    def __init__(self, inner: WriteHandle, budget: list[int]) -> None:
        self._inner, self._budget = inner, budget

    def write(self, data: memoryview) -> None:
        self._inner.write(data)
        self._budget[0] -= len(data)
        if self._budget[0] <= 0:
            os._exit(9)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DyingBackend:
    """Writes to keys that `dies_on` selects count against a byte budget; the process
    writing the byte that exhausts it exits at once (a rank dying in the middle of a save)."""

    def __init__(self, inner: Backend, dies_on: Callable[[str], bool], after: int) -> None:
        self._inner = inner
        self._dies_on = dies_on
        self._budget = [after]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def open_write(self, key: str, size: int) -> Any:
        handle = self._inner.open_write(key, size)
        return _DieAfterBytes(handle, self._budget) if self._dies_on(key) else handle

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> Any:
        handle = self._inner.open_write_region(key, offset, size, file_size)
        return _DieAfterBytes(handle, self._budget) if self._dies_on(f"{key}@{offset}") else handle
