"""What every storage backend offers: moving bytes by key, and nothing about models.

Keys are '/'-separated paths relative to the target. A backend never times itself or
prints: the runner owns the clock and wraps each call (open, write, sync, close, read).
A backend is a small core (open a key for write and for read, the handles' write, sync
and readinto, delete by name, list names); the rest of :class:`Backend` are defaults built
on it that a backend may override for speed, and optional capabilities are protocols a
backend has by defining their methods (N-1 writes, striping, planned reads, cache control,
unfinished uploads, transfer buffers). A run that needs one the backend lacks is refused
in one line before anything is created (:meth:`Backend.check_run`).
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast, runtime_checkable

from ckptbench import __version__
from ckptbench.backends.options import BackendOptions, IOHints
from ckptbench.errors import BackendError
from ckptbench.redact import redact

TARGET_MARKER = ".ckptbench-target"
ATOMIC_TMP = ".ckptbench-tmp"


def atomic_tmp(key: str) -> str:
    """Where put_atomic writes `key` before the rename: a fixed name, so that a cleanup after
    a crash knows it (the run's directories are its own, so two writers never share it)."""
    return key + ATOMIC_TMP


Identity = tuple[int, int]  # (st_dev, st_ino) of a directory a run created


class NameTaken(BackendError):
    """A directory a run wanted for itself exists already: it is never reused."""


class WriteHandle(ABC):
    """One file or object being written, in order, from offset 0."""

    @abstractmethod
    def write(self, data: memoryview) -> None:
        """Write all of `data` (for direct I/O: aligned; the final piece may be padded)."""

    @abstractmethod
    def sync(self) -> None:
        """Make everything written durable (fsync; completing a multipart upload)."""

    @abstractmethod
    def close(self) -> None: ...

    def abort(self) -> None:
        """Give up on a partial write; the runner removes the partial checkpoint."""
        self.close()


class ReadHandle(ABC):
    @abstractmethod
    def readinto(self, offset: int, buf: memoryview) -> int:
        """Read up to len(buf) bytes at `offset`; fewer only at the end of the file."""

    @abstractmethod
    def close(self) -> None: ...

    reads_ahead = False  # a planned handle that fetches ahead: the reader opens its next
    # file early and calls prefetch() (a handle that does not gains nothing from that)

    def borrow(self, offset: int, n: int) -> tuple[memoryview, Callable[[], None]] | None:
        """The `n` bytes at `offset` as a view of memory the handle already holds (a
        store's read-ahead buffer), and the call that gives the view back, so the reader
        verifies them in place; None (the default) where it holds no such memory: the
        caller reads them with readinto."""
        del offset, n
        return None

    def prefetch(self) -> None:
        """Start this planned handle's reads before its first readinto, as far as the
        reader's other handles leave room (their own next reads first). Default: none."""
        return None


@dataclass(frozen=True)
class Capabilities:
    """What a run may rely on of the backend's bytes beyond the abstract methods; checked
    once, before a run creates anything (:meth:`Backend.check_run`)."""

    restore: bool = True  # reads return what was written (the null backend keeps nothing)
    multi_process: bool = True  # what one process writes, the others can read


@runtime_checkable
class SharedFileWrites(Protocol):
    """N-1: one file written by several ranks, each its own region."""

    def create_shared(self, key: str, size: int) -> None:
        """Create the shared file `key` (once, by the coordinator, before the clock)."""

    def open_write_region(self, key: str, offset: int, size: int, file_size: int
                          ) -> WriteHandle:
        """Write `size` bytes at `offset` of the shared file `key` (of `file_size` bytes)."""


@runtime_checkable
class Striping(Protocol):
    """A stripe layout for the files made under a directory (Lustre, GlusterFS)."""

    def set_striping(self, prefix: str, stripe_size: int, stripe_count: int) -> dict[str, Any]:
        """Set the stripe layout of the files made under `prefix`; say what was applied,
        or why not (recorded in the run record)."""


@runtime_checkable
class PlannedReads(Protocol):
    """Reads known before the first one (a restore plan's): fetched ahead, concurrently."""

    def open_read_planned(self, key: str, spans: Sequence[tuple[int, int]]) -> ReadHandle:
        """A read handle for `key` that will be asked for `spans` ((offset, length), in
        this order); a read outside them is served all the same."""


@runtime_checkable
class PageCacheControl(Protocol):
    """Evicting a process's own files from a cache before a restore."""

    def drop_cache(self, keys: list[str]) -> str:
        """Keep restores of `keys` from reading what this process's save left in a cache;
        say how ('none' when nothing applies)."""


@runtime_checkable
class HostCacheControl(Protocol):
    """Dropping the whole host's page cache (one process per host, where permitted)."""

    def drop_host_caches(self) -> bool:
        """Drop the host's caches; say if it worked (after drop_cache said 'fadvise')."""


@runtime_checkable
class UnfinishedUploads(Protocol):
    """Uploads that stay pending when their writer dies (S3 multipart uploads): counted
    and aborted by key, in a cleanup. A store without them has nothing to abort."""

    def pending_uploads(self, keys: Sequence[str]) -> int | None:
        """How many unfinished uploads these keys have (reported before they are aborted);
        None when the store cannot say (then some may be left)."""

    def abort_uploads(self, keys: Sequence[str]) -> int:
        """Abort unfinished uploads of these keys (multipart uploads of a killed writer);
        how many."""


@runtime_checkable
class TransferBuffers(Protocol):
    """Memory a backend's transfers hold besides the runner's buffers (a store's upload
    parts and read-ahead ranges)."""

    def buffer_bytes(self) -> int:
        """The most such memory one process holds, counted in the run's memory bound
        before it starts."""

    def warm_reads(self) -> None:
        """Allocate and touch, in this process, the memory its reads will land in, before
        a restore's clock starts, as the runner's own buffers are: a restore times the
        store, not first-touch page faults (slow on a VM that hands free pages back)."""


def buffer_bytes_of(backend: Backend) -> int:
    """The transfer memory `backend` holds per process (TransferBuffers), else 0."""
    return backend.buffer_bytes() if isinstance(backend, TransferBuffers) else 0


def capabilities_of(cls: type[Backend]) -> dict[str, bool]:
    """What a backend class can do, as ``ckptbench backends`` lists it."""
    protocols = {"shared_file": SharedFileWrites, "striping": Striping,
                 "planned_reads": PlannedReads, "page_cache_control": PageCacheControl,
                 "host_cache_control": HostCacheControl, "unfinished_uploads":
                 UnfinishedUploads, "transfer_buffers": TransferBuffers}
    return {**{name: issubclass(cls, proto) for name, proto in protocols.items()},
            **dataclasses.asdict(cls.capabilities)}


def unsupported(backend: Backend, what: str) -> BackendError:
    return BackendError(f"{what} is not supported by the {backend.name} backend (target "
                        f"{backend.target}); allowed: {SHARED_FILE_TARGETS}")


SHARED_FILE_TARGETS = "a directory on a local or parallel file system (a path or file://)"


# How left_behind marks what the run itself could not remove (not someone else's files)
UPLOAD_NOT_ABORTED = " (unfinished upload: its abort was not confirmed)"
NOT_LISTED = " (not listed: "
OWN_LEFTOVERS = (UPLOAD_NOT_ABORTED, NOT_LISTED)


def own_leftover(name: str) -> bool:
    """A `left` entry about the run's own leftovers (not a file of someone else's)."""
    return any(mark in name for mark in OWN_LEFTOVERS)


class RequestWatch(Protocol):
    """A rank's stall watch as a backend's requests see it (runner.stall.StallWatch)."""

    def request(self, what: str) -> AbstractContextManager[None]:
        """Armed while one request outside a watched phase waits on the store."""
        ...

    def tick(self, n: int = 0) -> None:
        """The store answered (or bytes moved): the stall clock starts again."""
        ...


class Backend(ABC):
    """A storage system reached through one target (a directory, a bucket prefix, a URL).

    Subclasses set `name`, `Options` (their typed options) and `capabilities`, and get
    their options and the runner's I/O hints at construction.
    """

    name: ClassVar[str]
    Options: ClassVar[type[BackendOptions]] = BackendOptions
    capabilities: ClassVar[Capabilities] = Capabilities()
    # Buffers handed to write/readinto must be aligned to this many bytes (direct I/O).
    alignment: int = 1

    def __init__(self, target: str, options: BackendOptions | None = None,
                 hints: IOHints | None = None) -> None:
        self.target = target
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise BackendError(f"{self.name} backend: options of type {type(options).__name__}; "
                               f"allowed: {self.Options.__name__}")
        self.options = options
        self.hints = hints or IOHints()
        self.marked = False  # the default prepare() put the target marker there

    # --- what a run needs ---
    def check_run(self, shared_file: bool, restore: bool, processes: int,
                  own_storage: bool = False) -> None:
        """Refuse, in one line, a run this backend cannot serve: a shared (N-1) file,
        restores from a backend that keeps nothing, several processes on one that keeps
        its bytes in one process. `own_storage`: the format moves its bytes through a
        library's own storage layer (torch-dcp), not this backend's handles."""
        del own_storage
        caps = self.capabilities
        if shared_file and not isinstance(self, SharedFileWrites):
            raise BackendError(
                f"[checkpoint] files = 'shared' (one file written by all ranks) needs a file "
                f"system target; {self.target} is a {self.name} target; allowed there: "
                "dcp, per-rank, per-chunk")
        if restore and not caps.restore:
            raise BackendError(f"target {self.target}: the {self.name} backend keeps nothing to "
                               "restore; allowed: --no-restore (saves only)")
        if processes > 1 and not caps.multi_process:
            raise BackendError(f"target {self.target}: the {self.name} backend keeps its bytes in "
                               f"one process and this run has {processes}; allowed: one rank "
                               "(--ranks N), or one MPI process")

    # --- the target ---
    def prepare(self) -> None:
        """Check the target is usable and ours (or new/empty, then mark it); else raise
        BackendError naming the target and what is allowed. Default, on the core alone: a
        target holding the marker is ours; one holding anything else is refused; an empty
        one gets the marker."""
        if self.exists(TARGET_MARKER):
            return
        found = self.list_names("", 1)
        if found:
            raise foreign_target_error(self.target, found[0])
        self.put_atomic(TARGET_MARKER, marker_bytes(created_target=True))
        self.marked = True

    def release(self) -> None:
        """Undo prepare(): remove the target marker (and the target) if ckptbench created
        the target and nothing else is left in it. Default: the marker, by name."""
        if self.marked and set(self.list_names("", 2)) <= {TARGET_MARKER}:
            self.delete([TARGET_MARKER])
            self.marked = False

    def watch_requests(self, watch: RequestWatch) -> None:
        """This process's stall watch (a rank's, from the runner), for the requests the
        backend makes outside the saves' and restores' bytes (an object store's control
        requests): a backend whose requests can wait on a store that stopped answering
        arms it around each, so that is a stall at --stall-timeout. Default: nothing (a
        file system's calls are watched by the phases' bytes)."""
        del watch

    def cleaning_up(self, unresponsive: bool) -> None:
        """The run ended on this process: what it calls from now on is cleanup, bounded
        (a store with timeouts shortens them); `unresponsive`: the ranks saw the storage
        stop answering (a stall), so the cleanup gets one short try. Default: nothing."""
        return None

    def left_behind(self, prefix: str, limit: int) -> list[str]:
        """What a cleanup leaves under `prefix` (the cleanup record's `left`): the names
        listed there. A store that can hold more than names (unfinished uploads) or that
        could not be listed says so here, each such entry ending in one of OWN_LEFTOVERS,
        rather than report nothing."""
        return self.list_names(prefix, limit)

    def for_parent(self) -> Backend:
        """This backend for a process that forks the run's ranks after using it (`ckptbench
        restore` reads the manifest first): one whose reads start nothing a forked child
        cannot use. Default: itself."""
        return self

    # --- data ---
    @abstractmethod
    def open_write(self, key: str, size: int) -> WriteHandle:
        """A handle writing the new object `key` of `size` bytes (never an existing one)."""

    @abstractmethod
    def open_read(self, key: str) -> ReadHandle:
        """A handle reading `key`; FileNotFoundError if it is absent."""

    # Small objects (the manifest, the target marker), built on the core; a backend may
    # override them for speed or for a stronger commit (a rename).
    def put_atomic(self, key: str, data: bytes | memoryview) -> int | None:
        """Write a small object so that readers see all of it or nothing (the manifest).
        Where a rename commits the bytes written, the clock reading (perf_counter_ns)
        when the rename began; None where one request writes and commits (a PUT).
        Default: one open_write, written whole and synced (all or nothing where, as on an
        object store, an object appears when its write is synced)."""
        size = len(data)
        align = max(1, self.alignment)
        buf = _aligned(-(-size // align) * align)
        buf[:size] = memoryview(data).cast("B")
        h = self.open_write(key, size)
        try:
            if size:
                h.write(buf)
            h.sync()
        except BaseException:
            h.abort()
            raise
        h.close()
        return None

    def get(self, key: str) -> bytes:
        """Read a small object whole; FileNotFoundError if absent. Default: open_read (which
        raises FileNotFoundError for an absent key) and readinto to the end."""
        chunk = max(SMALL_READ, self.alignment)
        buf = _aligned(chunk)
        out = bytearray()
        h = self.open_read(key)
        try:
            while True:
                n = h.readinto(len(out), buf)
                out += buf[:n]
                if n < chunk:
                    return bytes(out)
        finally:
            h.close()

    def exists(self, key: str) -> bool:
        """Whether `key` is there. Default: get() finds it (small objects only)."""
        try:
            self.get(key)
        except FileNotFoundError:
            return False
        return True

    # --- what a run made, by name: a listing never decides what is deleted ---
    def create_dir(self, key: str) -> Identity | None:
        """Make `key` a new directory for this run alone (parents as needed); NameTaken when
        it exists. Returns what identifies it (device and inode) where the storage has
        directories that can be swapped for links, so that a cleanup deletes only in it. A
        store without directories: NameTaken when anything is stored under `key/` (nothing
        is created; the first object written claims it), and None."""
        if self.list_names(key, 1):
            raise NameTaken(f"{self.target}/{key}: already exists; ckptbench never reuses a "
                            "directory")
        return None

    def remove_recorded(self, chain: Sequence[tuple[str, Identity | None]],
                        names: Sequence[str], dirs: Sequence[str]) -> None:
        """Delete `names` (relative) in the directory that `chain` leads to (each step: a
        name and the identity create_dir returned), then its `dirs` (relative, deepest
        first) and that directory itself when that leaves them empty. Best effort, never
        raised. Stores without directories: by key (nothing can be swapped there)."""
        base = "/".join(name for name, _ in chain)
        self.delete([f"{base}/{n}" for n in names])
        for d in dirs:
            self.remove_dir(f"{base}/{d}")
        self.remove_dir(base)

    @abstractmethod
    def delete(self, keys: Sequence[str]) -> None:
        """Delete these files or objects (written by this run; absent ones are fine). Best
        effort, like a cleanup on the way out: failures are counted, never raised. A run
        deletes what it wrote by name, never by listing a prefix."""

    def remove_dir(self, key: str) -> None:
        """Remove directory `key` if it is empty (else leave it); stores without
        directories: nothing to do."""
        return None

    @abstractmethod
    def list_names(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` files or objects under `prefix/` (relative to the target; '' is the
        whole target), for reporting what is left there and for the default prepare();
        never used to decide what to delete."""

    def run_dirs(self) -> list[str]:
        """The directories (key prefixes) at the top of the target: where a later run looks
        for what an interrupted run left. Default: the first parts of the names listed in
        the whole target (up to RUN_DIRS_LISTED of them)."""
        return sorted({n.split("/", 1)[0] for n in self.list_names("", RUN_DIRS_LISTED)
                       if "/" in n})

    # --- what is recorded ---
    def stats(self) -> dict[str, int]:
        """Counters since the last call (e.g. retried requests), then reset; recorded per rank."""
        return {}

    @property
    def endpoint_url(self) -> str | None:
        """The endpoint another client (s3fs under torch DCP) should use for this target;
        None: that client's own configuration."""
        return None

    @property
    def local_dir(self) -> Path | None:
        """The local directory this target is, where it is one: a library writing through
        its own storage layer (torch DCP's FileSystemWriter) writes there; None: not local."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the results file records about this target, through redact (never secrets)."""
        return cast(dict[str, Any], redact({"backend": self.name, "target": self.target,
                                            "options": self.options.to_dict(), **self.details()}))

    def details(self) -> dict[str, Any]:
        """Backend-specific facts for describe() (file system, endpoint, versions...)."""
        return {}


SMALL_READ = 1 << 20  # the default get()'s read size
RUN_DIRS_LISTED = 1 << 16  # the names the default run_dirs() looks at


def _aligned(n: int) -> memoryview:
    """Page-aligned writable memory (direct I/O's buffers must be aligned)."""
    return memoryview(mmap.mmap(-1, max(n, mmap.PAGESIZE)))[:n]


def marker_bytes(created_target: bool = False, created_parents: int = 0) -> bytes:
    """The target marker; `created_target`: ckptbench made the directory itself (so the
    last run to leave it empty may remove it), and `created_parents` of its parents."""
    return json.dumps({"created_by": "ckptbench", "version": __version__,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "created_target": created_target,
                       "created_parents": created_parents}).encode()


def foreign_target_error(target: str, example: str) -> BackendError:
    return BackendError(
        f"target {target} holds files not made by ckptbench (e.g. {example!r}); "
        "allowed: a new or empty directory, or one ckptbench marked before"
    )
