"""How much of a file the page cache holds, and who dropped it: what a test needs to tell
a cached restore from an evicted one by measurement rather than by timing."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from harness.processes import ToolError

T = TypeVar("T")
TRIES = 20


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in
                ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_SYS_CACHESTAT = 451  # Linux >= 6.5, the same number on every architecture


def cached_bytes(path: str | Path) -> int:
    """Bytes of `path` in this host's page cache now (cachestat(2); on a FUSE mount: the
    client's copy). Opening the file does not change it; a ToolError where the kernel
    has no cachestat (before 6.5)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = _Cachestat()
        if libc.syscall(_SYS_CACHESTAT, fd, ctypes.byref(_CachestatRange(0, 0)),
                        ctypes.byref(stat), 0) != 0:
            err = ctypes.get_errno()
            raise ToolError(f"cachestat({path}): {os.strerror(err)} (Linux >= 6.5 has it)")
    finally:
        os.close(fd)
    return int(stat.nr_cache) * (os.sysconf("SC_PAGE_SIZE"))


def page_cache_drops() -> int:
    """How many times anyone on this host dropped the page cache (drop_caches, counted in
    /proc/vmstat): a cached measurement during which this grew may have lost its cache."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("drop_pagecache "):
            return int(line.split()[1])
    return 0


def undropped(attempt: Callable[[], T], tries: int = TRIES) -> T:
    """`attempt()` (which reads, checks what the page cache holds and raises
    AssertionError when it holds less than it should), tried again when it failed while
    another process on the host dropped the page cache (another test's restore evicts as
    root: with two test workers that happens beside any test); its own failure otherwise.
    RuntimeError when every try was voided so."""
    for _ in range(tries):
        drops = page_cache_drops()
        try:
            return attempt()
        except AssertionError:
            if page_cache_drops() == drops:
                raise
    raise RuntimeError(f"{tries} tries, each with the host's page cache dropped by another "
                       f"process ({page_cache_drops()} drops so far)")
