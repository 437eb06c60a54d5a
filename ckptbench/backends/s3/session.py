"""What an S3 upload or download handle (and the transports that make them) may use of
the backend that opened it: the session, a narrow view of S3Backend. Handles never reach
into the backend's private members; S3Backend satisfies this protocol (mypy checks it
wherever the backend hands itself to a handle)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ckptbench.backends.options import IOHints
from ckptbench.backends.s3.client import ProcessState, S3Clients
from ckptbench.backends.s3.options import S3Options
from ckptbench.errors import BackendError


class S3Session(Protocol):
    """The backend as its handles see it."""

    target: str
    bucket: str
    options: S3Options
    hints: IOHints
    clients: S3Clients
    concurrency: int  # requests in flight per handle
    max_attempts: int
    checksum: str
    zero_copy: bool  # part bodies sent from the caller's buffer (no checksum to compute)

    def object_key(self, key: str) -> str:
        """The object's key in the bucket (the target's prefix joined)."""
        ...

    def process(self) -> ProcessState:
        """This process's state: counters, spare buffers, the window of parts in flight."""
        ...

    def client(self, kind: str = "main") -> Any:
        """This process's boto3 client (untyped: botocore makes its methods at run time)."""
        ...

    def cleanup_client(self) -> Any:
        """The client for aborts and deletes: bounded, even when the endpoint is gone."""
        ...

    def limits(self) -> str:
        """The options that size the load (--s3-concurrency, --s3-max-attempts, now)."""
        ...

    def calls(self, action: str) -> AbstractContextManager[None]:
        """botocore's exceptions inside, as one-line BackendErrors."""
        ...

    def error(self, exc: BaseException, action: str) -> BackendError: ...

    def part_size_for(self, size: int) -> int: ...

    def abort_uploads(self, keys: Sequence[str]) -> int: ...
