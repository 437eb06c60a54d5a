"""Backends by target URL: one registry line per backend, imported only when used.

A path or file:// is the local/POSIX backend, s3:// the S3 backend; a scheme not listed
goes to fsspec (any URL an installed fsspec file system knows).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

from ckptbench.backends.base import Backend, Capabilities, ReadHandle, WriteHandle
from ckptbench.backends.options import BackendOptions, IOHints
from ckptbench.errors import BackendError

__all__ = ["BACKENDS", "Backend", "BackendOptions", "Capabilities", "IOHints", "ReadHandle",
           "WriteHandle", "backend_class", "open_backend", "registered", "scheme_of"]

OTHER = "*"  # any scheme not listed
BACKENDS: dict[str, str] = {
    "file": "ckptbench.backends.local:LocalBackend",
    "s3": "ckptbench.backends.s3:S3Backend",
    "null": "ckptbench.backends.null:NullBackend",
    "memory": "ckptbench.backends.memory:MemoryBackend",
    OTHER: "ckptbench.backends.fsspec_backend:FsspecBackend",
}


def scheme_of(target: str) -> str:
    return target.split("://", 1)[0] if "://" in target else "file"


def _load(entry: str) -> type[Backend]:
    module, _, name = entry.partition(":")
    return cast(type[Backend], getattr(importlib.import_module(module), name))


def backend_class(target: str) -> type[Backend]:
    """The backend class for `target` (its module imported now)."""
    scheme = scheme_of(target)
    entry = BACKENDS.get(scheme, BACKENDS[OTHER])
    try:
        return _load(entry)
    except ImportError as exc:
        raise BackendError(f"target {target}: the backend for {scheme}:// cannot be loaded "
                           f"({exc}); allowed: a path, or "
                           f"{', '.join(s + '://' for s in BACKENDS if s != OTHER)}") from None


def registered() -> dict[str, type[Backend]]:
    """scheme -> backend class, every registered backend ('*': any other scheme)."""
    return {scheme: _load(entry) for scheme, entry in BACKENDS.items()}


def open_backend(target: str, options: BackendOptions | Mapping[str, Any] | None = None,
                 hints: IOHints | None = None) -> Backend:
    """The backend for `target`, with typed options (or a mapping of option names, checked
    against the backend's Options) and the runner's I/O hints."""
    cls = backend_class(target)
    if options is not None and not isinstance(options, BackendOptions):
        options = cls.Options.from_mapping(options, cls.name)
    return cls(target, options, hints)
