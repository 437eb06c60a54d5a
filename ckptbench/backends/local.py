"""Local disks and POSIX parallel file systems (NVMe, Lustre, GPFS, BeeGFS, NFS).

Two I/O modes, chosen per run and recorded:

* ``buffered`` (default): write() + fsync(), what torch.save and DCP do;
* ``direct``: O_DIRECT with aligned buffers: the device ceiling, no page cache.

New files are created with O_EXCL, so nothing that exists is ever overwritten. A file
that several ranks share (N-1) is created once, empty, by the coordinator
(:meth:`LocalBackend.create_shared`, before the clock starts); each rank then opens it
without O_CREAT/O_TRUNC and writes its own region with pwrite
(:meth:`LocalBackend.open_write_region`).

The file system under the target comes from the mount table (filesystems.py): its
client caches decide what a cold restore takes (fadvise per file, drop_caches, or a
plain "warm: client cache not evictable (...)" where neither reaches), and its striping
tool or attribute applies ``[checkpoint] stripe_size/stripe_count`` (striping.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ckptbench.backends.base import (
    TARGET_MARKER,
    Backend,
    Identity,
    ReadHandle,
    WriteHandle,
    atomic_tmp,
    foreign_target_error,
    marker_bytes,
)
from ckptbench.backends.filesystems import (
    FileSystem,
    drop_page_cache,
    evict_from_page_cache,
    filesystem_info,
)
from ckptbench.backends.options import BackendOptions, IOHints, option
from ckptbench.backends.owned_dirs import make_dir, remove_recorded
from ckptbench.backends.striping import apply_striping, striping_command
from ckptbench.errors import BackendError
from ckptbench.fields import open_regular

__all__ = ["DIRECT_ALIGN", "IO_MODES", "LocalBackend", "LocalOptions", "apply_striping",
           "drop_page_cache", "evict_from_page_cache", "filesystem_info", "os_error",
           "striping_command"]

IO_MODES = ("buffered", "direct")
DIRECT_ALIGN = 4096


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    io: str = field(default="buffered", metadata=option(
        "--io", "Files: buffered + fsync (what frameworks do) or O_DIRECT (device ceiling).",
        choices=IO_MODES))


def os_error(path: str | Path, exc: OSError) -> BackendError:
    """One line for the usual ways a file system says no."""
    reason = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "not a directory",
        errno.EEXIST: "already exists (ckptbench never overwrites)",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return BackendError(f"{path}: {reason}")


def open_regular_file(path: Path, flags: int = 0) -> int:
    """A descriptor to read `path` by, refused in one line unless it is a regular file (a
    FIFO would block, a device would never end); FileNotFoundError when it is absent."""
    return open_regular(path, "allowed: a file ckptbench wrote", flags, error=BackendError)


class _FdCloser:
    """Closing an open file descriptor once, for the file handles below."""

    fd: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _FileWriter(_FdCloser, WriteHandle):
    """A new file written from offset 0; or, with `region`, a region of an existing file
    shared with other writers: (offset, size of the whole file)."""

    def __init__(self, path: Path, size: int, direct: bool,
                 region: tuple[int, int] | None = None) -> None:
        self.path = path
        self.size = size
        self.written = 0
        self.positioned = region is not None
        self.offset, self.file_size = region if region else (0, size)
        flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
        if region is None:
            flags |= os.O_CREAT | os.O_EXCL
        if direct:
            flags |= os.O_DIRECT
        try:
            if region is None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(path, flags, 0o644)
        except OSError as exc:
            if direct and exc.errno == errno.EINVAL:
                raise BackendError(
                    f"{path.parent}: the file system does not support O_DIRECT (--io direct);"
                    " allowed here: --io buffered"
                ) from None
            raise os_error(path, exc) from None

    def write(self, data: memoryview) -> None:
        try:
            while len(data):
                if self.positioned:
                    n = os.pwrite(self.fd, data, self.offset + self.written)
                else:
                    n = os.write(self.fd, data)
                self.written += n
                data = data[n:]
        except OSError as exc:
            raise os_error(self.path, exc) from None

    def sync(self) -> None:
        try:
            # Direct I/O padded the last block: only padding past the end of the file is
            # cut (a shared file's regions are aligned, so padding never reaches the next).
            if self.written and self.offset + self.written > self.file_size:
                os.ftruncate(self.fd, self.file_size)
            os.fsync(self.fd)
        except OSError as exc:
            raise os_error(self.path, exc) from None


class _FileReader(_FdCloser, ReadHandle):
    """A file read front to back. Buffered reads tell the kernel so (POSIX_FADV_SEQUENTIAL:
    a larger read-ahead window), as a loader streaming a checkpoint in should, and as fio
    does by default (fadvise_hint)."""

    def __init__(self, path: Path, direct: bool) -> None:
        self.path = path
        try:
            self.fd = open_regular_file(path, os.O_DIRECT if direct else 0)
        except FileNotFoundError as exc:
            raise os_error(path, exc) from None
        if not direct:
            with contextlib.suppress(OSError):  # a hint: file systems may not take it
                os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)

    def readinto(self, offset: int, buf: memoryview) -> int:
        try:
            return os.preadv(self.fd, [buf], offset)
        except OSError as exc:
            raise os_error(self.path, exc) from None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBackend(Backend):
    name = "local"
    Options: ClassVar[type[LocalOptions]] = LocalOptions
    options: LocalOptions

    def __init__(self, target: str, options: LocalOptions | None = None,
                 hints: IOHints | None = None) -> None:
        super().__init__(target, options, hints)
        path = target[len("file://"):] if target.startswith("file://") else target
        self.root = Path(path).absolute()
        self.io = self.options.io
        self.direct = self.io == "direct"
        self.alignment = DIRECT_ALIGN if self.direct else 1
        self.created_root = False
        self.created_parents = 0  # parents of the target that prepare() made

    def _path(self, key: str) -> Path:
        return self.root / key

    # --- the target ---
    def prepare(self) -> None:
        root = self.root
        if root.exists() and not root.is_dir():
            raise BackendError(f"target {root} is not a directory; allowed: a new or empty directory")
        if not root.exists():
            missing = [p for p in root.parents if not p.exists()]
            try:
                root.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_error(root.parent, exc) from None
            self.created_parents = len(missing)
            try:
                root.mkdir()
                self.created_root = True
            except FileExistsError:
                pass  # another run created it just now: checked below like any existing target
            except OSError as exc:
                raise os_error(root, exc) from None
        marker = root / TARGET_MARKER
        try:
            entries = [e for e in os.listdir(root) if e != TARGET_MARKER]
        except OSError as exc:
            raise os_error(root, exc) from None
        if not marker.exists():
            if entries:
                raise foreign_target_error(str(root), sorted(entries)[0])
            try:
                with open(marker, "xb") as f:
                    f.write(marker_bytes(self.created_root, self.created_parents))
            except FileExistsError:
                pass  # another run marked this empty directory at the same moment
            except OSError as exc:
                if self.created_root:
                    self._undo_root()
                raise os_error(root, exc) from None
        if not os.access(root, os.W_OK):
            raise BackendError(f"{root}: permission denied (the target must be writable)")

    def _undo_root(self, parents: int | None = None) -> None:
        """Remove the target (and the `parents` of it that were made for it) if empty."""
        with contextlib.suppress(OSError):
            self.root.rmdir()
            for parent in list(self.root.parents)[:self.created_parents if parents is None
                                                  else parents]:
                parent.rmdir()  # stops at the first that is not empty

    def release(self) -> None:
        """Remove the marker and the target, and the parents made for it, when ckptbench
        made the target and nothing else is left in it: this run made it, or the marker
        says ckptbench did (another run on the same target made it and left first)."""
        made = self._marker_made()
        if not self.created_root and made is None:
            return
        try:
            if [e for e in os.listdir(self.root) if e != TARGET_MARKER]:
                return
            (self.root / TARGET_MARKER).unlink(missing_ok=True)
        except OSError:
            return
        self._undo_root(max(self.created_parents, made or 0))

    def _marker_made(self) -> int | None:
        """How many parents the run that made the target made for it (its marker), or None
        when the marker does not say ckptbench made the target."""
        try:
            marker = json.loads((self.root / TARGET_MARKER).read_bytes())
            parents = marker.get("created_parents", 0)
            if not marker.get("created_target"):
                return None
            return parents if isinstance(parents, int) and 0 <= parents < 64 else 0
        except (OSError, ValueError, AttributeError):
            return None

    # --- data ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        return _FileWriter(self._path(key), size, self.direct)

    def open_read(self, key: str) -> ReadHandle:
        return _FileReader(self._path(key), self.direct)

    # --- one file, several writers (N-1) ---
    def create_shared(self, key: str, size: int) -> None:
        """Create the empty shared file (O_EXCL: never an existing one); writers open it next."""
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             0o644))
        except OSError as exc:
            raise os_error(path, exc) from None
        del size  # not pre-sized: the writers extend it, as a framework's writers would

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> WriteHandle:
        """Write `size` bytes at `offset` of the shared file `key` (of `file_size` bytes)."""
        if self.direct and offset % DIRECT_ALIGN:
            raise BackendError(f"{self._path(key)}: region offset {offset} is not aligned to "
                               f"{DIRECT_ALIGN} bytes for --io direct")
        return _FileWriter(self._path(key), size, self.direct, region=(offset, file_size))

    def set_striping(self, prefix: str, stripe_size: int, stripe_count: int) -> dict[str, Any]:
        """Create directory `prefix` and set its striping for the files made under it."""
        path = self._path(prefix)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(path, exc) from None
        return apply_striping(path, FileSystem.of(path).fs_type, stripe_size, stripe_count)

    def put_atomic(self, key: str, data: bytes | memoryview) -> int | None:
        path = self._path(key)
        tmp = path.with_name(atomic_tmp(path.name))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            renamed = time.perf_counter_ns()
            os.rename(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise os_error(path, exc) from None
        return renamed

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with os.fdopen(open_regular_file(path), "rb") as f:
            return f.read()

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def remove_tree(self, prefix: str) -> None:
        path = self._path(prefix)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()

    # --- what a run made, by name ---
    def create_dir(self, key: str) -> Identity:
        path = self._path(key)
        try:
            return make_dir(path)
        except OSError as exc:
            raise os_error(path, exc) from None

    def remove_recorded(self, chain: Sequence[tuple[str, Identity | None]],
                        names: Sequence[str], dirs: Sequence[str]) -> None:
        """Only in the directories the run created, never through a link (owned_dirs)."""
        remove_recorded(self.root, chain, names, dirs)

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            with contextlib.suppress(OSError):  # absent, or replaced by a directory: left
                self._path(key).unlink()

    def remove_dir(self, key: str) -> None:
        with contextlib.suppress(OSError):  # not empty (someone else's files), or absent
            self._path(key).rmdir()

    def list_names(self, prefix: str, limit: int) -> list[str]:
        """Files and links under `prefix`, and directories with nothing in them (as 'name/')."""
        base = self._path(prefix)
        out: list[str] = []
        for top, dirs, files in os.walk(base):
            dirs.sort()
            rel = Path(top).relative_to(self.root)
            links = sorted(d for d in dirs if os.path.islink(os.path.join(top, d)))
            names = [str(rel / f) for f in sorted([*files, *links])]
            if not files and not dirs and Path(top) != base:
                names = [f"{rel}/"]
            out += names[:limit - len(out)]
            if len(out) >= limit:
                break
        return out

    def run_dirs(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def drop_cache(self, keys: list[str]) -> str:
        """O_DIRECT needs nothing; else fadvise(DONTNEED) per file. Then, where the client
        keeps data outside the page cache (Gluster's io-cache, the GPFS pagepool...): the
        host's caches dropped when permitted (that empties Gluster's io-cache), and if the
        cache may still hold data, the restore is recorded as warm, never as cold."""
        method = "direct" if self.direct else "fadvise"
        if not self.direct:
            evict_from_page_cache(self._path(key) for key in keys)
        fs = FileSystem.of(self.root)
        held = fs.client_cache_held(self.direct)
        if held and fs.is_gluster and drop_page_cache():
            # The kernel forgets the inodes and io-cache frees their pages: a client
            # statedump then lists only the root directory (docs/parallel-fs.md).
            held = None
        return f"warm: client cache not evictable ({held})" if held else method

    def drop_host_caches(self) -> bool:
        return drop_page_cache()

    @property
    def local_dir(self) -> Path | None:
        return self.root

    def details(self) -> dict[str, Any]:
        return {"path": str(self.root), **filesystem_info(self.root),
                **FileSystem.of(self.root).describe()}
