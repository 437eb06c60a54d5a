"""Backends by target URL: a path or file:// is local/POSIX, s3:// is S3, others fsspec."""

from __future__ import annotations

from typing import Any

from ckptbench.backends.base import Backend, ReadHandle, WriteHandle
from ckptbench.errors import BackendError

__all__ = ["Backend", "ReadHandle", "WriteHandle", "open_backend", "scheme_of"]


def scheme_of(target: str) -> str:
    return target.split("://", 1)[0] if "://" in target else "file"


def open_backend(target: str, options: dict[str, Any] | None = None) -> Backend:
    scheme = scheme_of(target)
    if scheme == "file":
        from ckptbench.backends.local import LocalBackend

        return LocalBackend(target, options)
    if scheme == "s3":
        try:
            from ckptbench.backends.s3 import S3Backend
        except ImportError as exc:  # pragma: no cover - boto3 is a core dependency
            raise BackendError(f"s3 targets need boto3 ({exc})") from None
        return S3Backend(target, options)
    try:
        from ckptbench.backends.fsspec_backend import FsspecBackend
    except ImportError:
        raise BackendError(f"target {target}: no backend for scheme {scheme!r}; allowed: a path, file://, s3://") from None
    return FsspecBackend(target, options)
