"""Any other storage fsspec reaches (gcs://, az://, memory://, hdfs://, s3a:// via s3fs, ...).

The file system is made with its instance cache and listings cache off, and files are
read with no read-ahead cache, so a benchmark measures the store, never a cache.

Durability point: ``sync`` flushes and, for a local file, fsyncs, then closes the file:
for object stores closing is what commits the upload (fsspec's buffered files upload
on close), so the object exists exactly when ``sync`` returns.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ckptbench.backends.base import (
    TARGET_MARKER,
    Backend,
    Identity,
    NameTaken,
    ReadHandle,
    WriteHandle,
    atomic_tmp,
    marker_bytes,
)
from ckptbench.backends.options import BackendOptions, IOHints, option
from ckptbench.backends.owned_dirs import make_dir, remove_recorded
from ckptbench.errors import BackendError

# Flat key spaces: no directories to make (and s3fs's makedirs may create a bucket).
OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "gcsfs", "az", "abfs", "abfss", "adl", "oss",
                 "r2", "ocilake", "oci", "tos", "tosfs", "boxfs", "dropbox", "http", "https"}
S3_LIKE = {"s3", "s3a"}
DEFAULT_BLOCK = 8 << 20


@dataclass(frozen=True)
class FsspecOptions(BackendOptions):
    endpoint_url: str | None = field(default=None, metadata=option(
        "--endpoint-url", "Endpoint of an s3-like file system (s3a:// through s3fs)."))
    block_size: int = field(default=DEFAULT_BLOCK, metadata=option(
        "--part-size", "Write (upload part) and read block size of the fsspec file.",
        minimum=1, size=True))
    # Passed to the file system as it is (library callers); credentials are redacted.
    storage_options: Mapping[str, Any] = field(default_factory=dict)


def _protocols(fs: Any) -> set[str]:
    proto = fs.protocol
    return {proto} if isinstance(proto, str) else set(proto)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}".rstrip(": ")


class _FsspecWriter(WriteHandle):
    def __init__(self, backend: FsspecBackend, key: str, size: int) -> None:
        self.b = backend
        self.key = key
        self.path = backend._path(key)
        self.size = size
        self.written = 0
        backend._mkdirs(self.path)
        with backend.calls(f"create {key}"):
            self.f = backend.fs.open(self.path, "wb", **backend.write_kwargs)

    def write(self, data: memoryview) -> None:
        view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
        view = view[:max(0, self.size - self.written)]
        if not len(view):
            return
        with self.b.calls(f"write {self.key}"):
            self.f.write(view)
        self.written += len(view)

    def sync(self) -> None:
        if self.f.closed:
            return
        with self.b.calls(f"sync {self.key}"):
            self.f.flush()
            raw = getattr(self.f, "f", None)  # fsspec's LocalFileOpener wraps a real file
            if raw is not None and hasattr(raw, "fileno"):
                os.fsync(raw.fileno())
            self.f.close()  # object stores: completes the upload

    def close(self) -> None:
        if not self.f.closed:
            with self.b.calls(f"close {self.key}"):
                self.f.close()

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            if hasattr(self.f, "discard"):  # s3fs & co.: abort the multipart upload
                self.f.discard()
                self.f.closed = True  # discarded: nothing left to flush, even in __del__
            elif not self.f.closed:
                self.f.close()
        with contextlib.suppress(Exception):
            self.b.fs.rm_file(self.path)


class _FsspecReader(ReadHandle):
    def __init__(self, backend: FsspecBackend, key: str) -> None:
        self.b = backend
        self.key = key
        with backend.calls(f"open {key}"):
            self.f = backend.fs.open(backend._path(key), "rb", **backend.read_kwargs)

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B") if memoryview(buf).format != "B" else memoryview(buf)
        got = 0
        with self.b.calls(f"read {self.key}"):
            self.f.seek(offset)
            while got < len(view):
                n = self.f.readinto(view[got:])
                if not n:
                    break
                got += n
        return got

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.f.close()


class FsspecBackend(Backend):
    name = "fsspec"
    Options: ClassVar[type[FsspecOptions]] = FsspecOptions
    options: FsspecOptions

    def __init__(self, target: str, options: FsspecOptions | None = None,
                 hints: IOHints | None = None) -> None:
        super().__init__(target, options, hints)
        import fsspec

        o = self.options
        self.block_size = o.block_size
        storage: dict[str, Any] = dict(o.storage_options)
        scheme = target.split("://", 1)[0]
        if o.endpoint_url and scheme in S3_LIKE:
            storage.setdefault("endpoint_url", o.endpoint_url)
        # Caches off: a new instance (not a cached one) and no directory-listing cache.
        storage.update(skip_instance_cache=True, use_listings_cache=False)
        try:
            self.fs, root = fsspec.core.url_to_fs(target, **storage)
        except (ImportError, ValueError) as exc:
            raise BackendError(f"target {target}: {_reason(exc)}; allowed: a path, s3://, or a URL "
                               "of an installed fsspec file system") from None
        except TypeError as exc:
            raise BackendError(f"target {target}: {_reason(exc)}") from None
        self.root = root.rstrip("/") or root
        self.protocols = _protocols(self.fs)
        self.flat = bool(self.protocols & OBJECT_STORES)
        self.local = bool(self.protocols & {"file", "local"})
        self.write_kwargs: dict[str, Any] = {} if self.local else {"block_size": self.block_size}
        # No read-ahead or block cache: every read reaches the store.
        self.read_kwargs: dict[str, Any] = {} if self.local else {"cache_type": "none",
                                                                   "block_size": self.block_size}
        self.created_marker = False
        self.created_root = False
        self._made: set[str] = set()

    def _path(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.root}/{key}" if key else self.root

    @contextlib.contextmanager
    def calls(self, action: str) -> Any:
        try:
            yield
        except BackendError:
            raise
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise BackendError(f"{self.target}: {action}: {_reason(exc)}") from None

    def _mkdirs(self, path: str) -> None:
        if self.flat:
            return
        parent = path.rsplit("/", 1)[0]
        if parent and parent not in self._made:
            with self.calls(f"create {parent}"):
                self.fs.makedirs(parent, exist_ok=True)
            self._made.add(parent)

    # --- the target ---
    def prepare(self) -> None:
        marker = self._path(TARGET_MARKER)
        with self.calls("check the target"):
            exists = self.fs.exists(self.root)
            if exists and not self.flat and not self.fs.isdir(self.root):
                raise BackendError(f"target {self.target} is not a directory; allowed: a new or "
                                   "empty directory")
            if not exists and not self.flat:
                self.fs.makedirs(self.root, exist_ok=True)
                self.created_root = True
            entries = [e for e in (self.fs.ls(self.root, detail=False) if exists else [])
                       if e.rstrip("/").rsplit("/", 1)[-1] != TARGET_MARKER]
            has_marker = self.fs.exists(marker)
        if has_marker:
            return
        if entries:
            self._undo_root()
            raise BackendError(
                f"target {self.target} holds files not made by ckptbench (e.g. "
                f"{sorted(entries)[0].rsplit('/', 1)[-1]!r}); allowed: a new or empty "
                "directory or prefix, or one ckptbench marked before")
        with self.calls("mark the target"):
            self.fs.pipe_file(marker, marker_bytes())
        self.created_marker = True

    def _undo_root(self) -> None:
        if self.created_root:
            with contextlib.suppress(Exception):
                self.fs.rmdir(self.root)
            self.created_root = False

    def release(self) -> None:
        if not self.created_marker:
            return
        with contextlib.suppress(Exception):
            left = [e for e in self.fs.ls(self.root, detail=False)
                    if e.rstrip("/").rsplit("/", 1)[-1] != TARGET_MARKER]
            if left:
                return
            self.fs.rm_file(self._path(TARGET_MARKER))
            self.created_marker = False
            self._undo_root()

    # --- data ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        return _FsspecWriter(self, key, size)

    def open_read(self, key: str) -> ReadHandle:
        return _FsspecReader(self, key)

    def put_atomic(self, key: str, data: bytes | memoryview) -> int | None:
        path = self._path(key)
        self._mkdirs(path)
        with self.calls(f"put {key}"):
            if self.flat or not self.local:
                # One PUT (object stores) or one store assignment (memory): all or nothing.
                self.fs.pipe_file(path, bytes(data))
                return None
            tmp = atomic_tmp(path)
            try:
                with self.fs.open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.f.fileno())
                renamed = time.perf_counter_ns()
                self.fs.mv(tmp, path)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.fs.rm_file(tmp)
                raise
            return renamed

    def get(self, key: str) -> bytes:
        with self.calls(f"get {key}"):
            return bytes(self.fs.cat_file(self._path(key)))

    def exists(self, key: str) -> bool:
        with self.calls(f"look up {key}"):
            return bool(self.fs.exists(self._path(key)))

    def remove_tree(self, prefix: str) -> None:
        if not prefix.strip("/") or prefix.strip("/") == TARGET_MARKER:
            raise BackendError(f"{self.target}: refusing to remove the whole target")
        with contextlib.suppress(FileNotFoundError, BackendError), self.calls(f"remove {prefix}"):
            path = self._path(prefix)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)

    # --- what a run made, by name ---
    def create_dir(self, key: str) -> Identity | None:
        """fsspec's local file system (local://): made exclusively and identified by
        device and inode, as the local backend does (owned_dirs). Elsewhere an fsspec store
        has no inode to check: a name taken is refused, cleanup deletes by recorded name."""
        path = self._path(key)
        if self.local:
            try:
                ident = make_dir(Path(path))
            except OSError as exc:
                raise BackendError(f"{self.target}: create {key}: {_reason(exc)}") from None
            self._made.add(path)
            return ident
        if self.flat:
            return super().create_dir(key)  # nothing stored under it, else NameTaken
        parent = path.rsplit("/", 1)[0]
        with self.calls(f"create {key}"):
            if parent != path:
                self.fs.makedirs(parent, exist_ok=True)
            if self.fs.exists(path):
                raise NameTaken(f"{self.target}/{key}: already exists; ckptbench never reuses "
                                "a directory")
            try:
                self.fs.mkdir(path, create_parents=False)
            except FileExistsError:
                raise NameTaken(f"{self.target}/{key}: already exists; ckptbench never reuses "
                                "a directory") from None
        self._made.add(path)
        return None

    def remove_recorded(self, chain: Sequence[tuple[str, Identity | None]],
                        names: Sequence[str], dirs: Sequence[str]) -> None:
        """local://: only in the directories the run created, never through a link
        (owned_dirs); other stores by recorded name (Backend.remove_recorded)."""
        if not self.local:
            super().remove_recorded(chain, names, dirs)
            return
        remove_recorded(Path(self.root), chain, names, dirs)
        base = self._path("/".join(name for name, _ in chain))
        self._made = {m for m in self._made if m != base and not m.startswith(base + "/")}

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            with contextlib.suppress(Exception):  # absent (or not ours to judge): left
                path = self._path(key)
                if self.fs.isfile(path):
                    self.fs.rm_file(path)

    def remove_dir(self, key: str) -> None:
        if self.flat:
            return
        path = self._path(key)
        with contextlib.suppress(Exception):
            if self.fs.isdir(path) and not self.fs.ls(path, detail=False):
                self.fs.rmdir(path)
        self._made = {m for m in self._made if m != path and not m.startswith(path + "/")}

    def list_names(self, prefix: str, limit: int) -> list[str]:
        base = self._path(prefix)
        strip = len(self.root.rstrip("/")) + 1
        try:
            with self.calls(f"list {prefix}"):
                found = self.fs.find(base, withdirs=not self.flat, detail=True)
        except (BackendError, FileNotFoundError):
            return []
        out = []
        for found_name, info in sorted(found.items()):
            path = self.fs._strip_protocol(found_name)
            if info.get("type") == "directory":
                if self.fs.ls(path, detail=False):
                    continue  # listed through what is inside it
                path += "/"
            out.append(path[strip:])
            if len(out) >= limit:
                break
        return out

    def run_dirs(self) -> list[str]:
        with self.calls("list the target"):
            if not self.fs.exists(self.root):
                return []
            entries = self.fs.ls(self.root, detail=True)
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries
                      if e.get("type") == "directory")

    def drop_cache(self, keys: list[str]) -> str:
        if not self.local:
            return "none"
        from ckptbench.backends.local import evict_from_page_cache

        evict_from_page_cache(self.fs._strip_protocol(self._path(key)) for key in keys)
        return "fadvise"

    @property
    def endpoint_url(self) -> str | None:
        return self.options.endpoint_url

    @property
    def local_dir(self) -> Path | None:
        return Path(self.root) if self.local else None

    def details(self) -> dict[str, Any]:
        import fsspec

        return {"filesystem": f"{type(self.fs).__module__}."
                f"{type(self.fs).__name__}", "protocol": sorted(self.protocols),
                "root": self.root, "fsspec": fsspec.__version__,
                "caches": {"instance": False, "listings": False,
                           "read": "none" if not self.local else "page cache (fadvise)"},
                "block_size": self.block_size}
