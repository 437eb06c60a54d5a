"""Backends and write handles that forward every call to the one they wrap: the typed base
of the fault wrappers (:mod:`ckptbench.testing.faults`) and of a third party's own.

Every method of the :class:`Backend` core and of each capability protocol is forwarded by
a method written out here, never through ``__getattr__``: mypy checks each against the
signature it forwards, and a test checks that none is missing, so a method added to
Backend that no wrapper forwards fails there instead of running Backend's default on the
wrapper without a word. A wrapper has a capability exactly when the backend inside has
it: making one picks the class that adds the forwarding methods of those capabilities, so
``isinstance(wrapper, SharedFileWrites)`` answers as it would for the backend inside.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ckptbench.backends.base import (
    Backend,
    HostCacheControl,
    Identity,
    PageCacheControl,
    PlannedReads,
    ReadHandle,
    RequestWatch,
    SharedFileWrites,
    Striping,
    TransferBuffers,
    UnfinishedUploads,
    WriteHandle,
    unsupported,
)


class ForwardingWriteHandle(WriteHandle):
    """A write handle that passes every call on to `inner` (subclasses change one)."""

    def __init__(self, inner: WriteHandle) -> None:
        self.inner = inner

    def write(self, data: memoryview) -> None:
        self.inner.write(data)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


# Each forwarder below is mixed in only where inner has its capability; the isinstance
# checks say so to mypy (and refuse a call should one be made on another backend).


class ForwardSharedFileWrites(SharedFileWrites):
    inner: Backend

    def create_shared(self, key: str, size: int) -> None:
        inner = self.inner
        if not isinstance(inner, SharedFileWrites):
            raise unsupported(inner, "one file written by several ranks")
        inner.create_shared(key, size)

    def open_write_region(self, key: str, offset: int, size: int, file_size: int
                          ) -> WriteHandle:
        inner = self.inner
        if not isinstance(inner, SharedFileWrites):
            raise unsupported(inner, "one file written by several ranks")
        return inner.open_write_region(key, offset, size, file_size)


class ForwardStriping(Striping):
    inner: Backend

    def set_striping(self, prefix: str, stripe_size: int, stripe_count: int) -> dict[str, Any]:
        inner = self.inner
        if not isinstance(inner, Striping):
            raise unsupported(inner, "striping")
        return inner.set_striping(prefix, stripe_size, stripe_count)


class ForwardPlannedReads(PlannedReads):
    inner: Backend

    def open_read_planned(self, key: str, spans: Sequence[tuple[int, int]]) -> ReadHandle:
        inner = self.inner
        if not isinstance(inner, PlannedReads):
            raise unsupported(inner, "planned reads")
        return inner.open_read_planned(key, spans)


class ForwardPageCacheControl(PageCacheControl):
    inner: Backend

    def drop_cache(self, keys: list[str]) -> str:
        inner = self.inner
        if not isinstance(inner, PageCacheControl):
            raise unsupported(inner, "page-cache control")
        return inner.drop_cache(keys)


class ForwardHostCacheControl(HostCacheControl):
    inner: Backend

    def drop_host_caches(self) -> bool:
        inner = self.inner
        if not isinstance(inner, HostCacheControl):
            raise unsupported(inner, "dropping the host's caches")
        return inner.drop_host_caches()


class ForwardUnfinishedUploads(UnfinishedUploads):
    inner: Backend

    def pending_uploads(self, keys: Sequence[str]) -> int | None:
        inner = self.inner
        if not isinstance(inner, UnfinishedUploads):
            raise unsupported(inner, "unfinished uploads")
        return inner.pending_uploads(keys)

    def abort_uploads(self, keys: Sequence[str]) -> int:
        inner = self.inner
        if not isinstance(inner, UnfinishedUploads):
            raise unsupported(inner, "unfinished uploads")
        return inner.abort_uploads(keys)


class ForwardTransferBuffers(TransferBuffers):
    inner: Backend

    def buffer_bytes(self) -> int:
        inner = self.inner
        if not isinstance(inner, TransferBuffers):
            raise unsupported(inner, "transfer buffers")
        return inner.buffer_bytes()

    def warm_reads(self) -> None:
        inner = self.inner
        if not isinstance(inner, TransferBuffers):
            raise unsupported(inner, "transfer buffers")
        inner.warm_reads()


# Each capability protocol and the class that forwards it (a test checks none is missing).
CAPABILITY_FORWARDERS: tuple[tuple[type, type], ...] = (
    (SharedFileWrites, ForwardSharedFileWrites),
    (Striping, ForwardStriping),
    (PlannedReads, ForwardPlannedReads),
    (PageCacheControl, ForwardPageCacheControl),
    (HostCacheControl, ForwardHostCacheControl),
    (UnfinishedUploads, ForwardUnfinishedUploads),
    (TransferBuffers, ForwardTransferBuffers),
)
_CLASSES: dict[tuple[type, type, tuple[type, ...]], type] = {}


class ForwardingBackend(Backend):
    """A backend that passes every call on to `inner` (subclasses change one). Its name,
    options, hints and alignment are inner's; it has inner's capabilities (see the module
    docstring)."""

    name: ClassVar[str] = "forwarding"

    def __new__(cls, inner: Backend, *args: Any, **kwargs: Any) -> ForwardingBackend:
        del args, kwargs
        mixins = tuple(f for kind, f in CAPABILITY_FORWARDERS if isinstance(inner, kind))
        key = (cls, type(inner), mixins)
        made = _CLASSES.get(key)
        if made is None:
            made = _CLASSES[key] = types.new_class(
                cls.__name__, (cls, *mixins), exec_body=_copy_class_facts(type(inner)))
            made.__module__ = cls.__module__
        out: ForwardingBackend = object.__new__(made)
        return out

    def __init__(self, inner: Backend) -> None:  # not Backend's: the options are inner's
        self.inner = inner
        self.target = inner.target
        self.options = inner.options
        self.hints = inner.hints
        self.alignment = inner.alignment

    def check_run(self, shared_file: bool, restore: bool, processes: int,
                  own_storage: bool = False) -> None:
        self.inner.check_run(shared_file, restore, processes, own_storage)

    def prepare(self) -> None:
        self.inner.prepare()

    def release(self) -> None:
        self.inner.release()

    def watch_requests(self, watch: RequestWatch) -> None:
        self.inner.watch_requests(watch)

    def cleaning_up(self, unresponsive: bool) -> None:
        self.inner.cleaning_up(unresponsive)

    def left_behind(self, prefix: str, limit: int) -> list[str]:
        return self.inner.left_behind(prefix, limit)

    def for_parent(self) -> Backend:
        """Itself where inner is its own parent's backend; else inner's (the parent only
        reads the manifest, so nothing is left to break)."""
        parent = self.inner.for_parent()
        return self if parent is self.inner else parent

    def open_write(self, key: str, size: int) -> WriteHandle:
        return self.inner.open_write(key, size)

    def open_read(self, key: str) -> ReadHandle:
        return self.inner.open_read(key)

    def put_atomic(self, key: str, data: bytes | memoryview) -> int | None:
        return self.inner.put_atomic(key, data)

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def create_dir(self, key: str) -> Identity | None:
        return self.inner.create_dir(key)

    def remove_recorded(self, chain: Sequence[tuple[str, Identity | None]],
                        names: Sequence[str], dirs: Sequence[str]) -> None:
        self.inner.remove_recorded(chain, names, dirs)

    def delete(self, keys: Sequence[str]) -> None:
        self.inner.delete(keys)

    def remove_dir(self, key: str) -> None:
        self.inner.remove_dir(key)

    def list_names(self, prefix: str, limit: int) -> list[str]:
        return self.inner.list_names(prefix, limit)

    def run_dirs(self) -> list[str]:
        return self.inner.run_dirs()

    def stats(self) -> dict[str, int]:
        return self.inner.stats()

    @property
    def endpoint_url(self) -> str | None:
        return self.inner.endpoint_url

    @property
    def local_dir(self) -> Path | None:
        return self.inner.local_dir

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def details(self) -> dict[str, Any]:
        return self.inner.details()


def _copy_class_facts(inner: type[Backend]) -> Callable[[dict[str, Any]], None]:
    """The class body of a wrapper of `inner`: inner's class-level facts (its name in
    records and messages, its options' type, what its bytes can be relied on for)."""

    def body(ns: dict[str, Any]) -> None:
        ns.update(name=inner.name, Options=inner.Options, capabilities=inner.capabilities)

    return body
