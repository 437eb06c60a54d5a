"""``--s3-transport obstore``: object data through ``obstore``, Python's binding of the
Rust ``object_store`` crate (its own tokio threads and HTTP client; the interpreter lock
released while requests run).

Uploads go through obstore's writable file: each ``write`` hands it a copy of the runner's
block (obstore keeps what it is given until sent); an object larger than one part becomes a multipart upload with up to
``--s3-concurrency`` parts in flight, completed by ``close`` at ``sync``. ``abort`` drops
the writer and aborts the object's unfinished multipart uploads through botocore (obstore's
writer has no abort). Restores are ranged GETs issued ahead of the reader
(:mod:`.readahead`) on a small thread pool, each read into memory Rust owns and copied
once into the runner's buffer.

Credentials come from boto3's standard chain through obstore's credential-provider hook;
retries are object_store's (``--s3-max-attempts``), which obstore does not report: the
records say ``retries_counted: false``.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import S3Store

from ckptbench.backends.base import ReadHandle, WriteHandle
from ckptbench.backends.s3.errors import native_allowed
from ckptbench.backends.s3.readahead import Chunk, ReadAhead
from ckptbench.backends.s3.sizing import PART_RANGE
from ckptbench.backends.s3.transport import credentials
from ckptbench.errors import BackendError

if TYPE_CHECKING:
    from ckptbench.backends.s3.session import S3Session


_CODE = re.compile(r"<Code>([^<]{1,64})</Code>")
_STATUS = re.compile(r"status(?: code)?:? (\d{3})\b")  # in obstore's message, if at all
_state = {"used": False, "forked_after_use": False}
# obstore's runtime (tokio) does not survive a fork: a child of a process that used it
# hangs on its first request. The runner forks before any data moves; say so otherwise.
os.register_at_fork(after_in_child=lambda: _state.update(forked_after_use=_state["used"]))


def make(backend: S3Session) -> ObstoreTransport:
    if _state["forked_after_use"]:
        raise BackendError(f"{backend.target}: --s3-transport obstore cannot run in a process "
                           "forked after obstore was used (its runtime does not survive a "
                           "fork); allowed: fork first (as the runner does), or --s3-transport "
                           "crt or botocore")
    _state["used"] = True
    return ObstoreTransport(backend)


class ObstoreTransport:
    def __init__(self, backend: S3Session) -> None:
        self.b = backend
        o = backend.options
        r = backend.clients.resolve()

        def keys() -> dict[str, Any]:
            c = credentials(backend)
            return {"access_key_id": c.access_key, "secret_access_key": c.secret_key,
                    "token": c.token, "expires_at": None}

        signed = o.payload_signing == "on" or (o.payload_signing == "auto"
                                               and r.endpoint.startswith("http://"))
        self.store = S3Store(
            backend.bucket,
            config={"endpoint": r.endpoint, "region": r.region,
                    "virtual_hosted_style_request": r.addressing_style != "path",
                    "unsigned_payload": not signed,
                    # object_store's one request checksum: SHA-256 (recorded as such)
                    **({"checksum_algorithm": "sha256"} if o.checksum == "when_supported"
                       else {})},
            client_options={"allow_http": r.endpoint.startswith("http://"),
                            "connect_timeout": timedelta(seconds=o.connect_timeout),
                            "timeout": timedelta(seconds=o.read_timeout)},
            retry_config={"max_retries": o.max_attempts - 1,
                          "retry_timeout": timedelta(seconds=o.read_timeout * o.max_attempts)},
            credential_provider=keys)  # type: ignore[arg-type,unused-ignore]
        self.range = PART_RANGE[0]
        self.pool = ThreadPoolExecutor(backend.concurrency * backend.hints.threads,
                                       thread_name_prefix="ckptbench-obstore")

    def fail(self, action: str, exc: BaseException) -> BackendError:
        """One line: obstore's error class and its first line (never a key: the provider
        hands keys to Rust, which does not print them)."""
        text = str(exc)
        code = _CODE.search(text)
        first = text.strip().splitlines()[0][:160] if text.strip() else ""
        what = f"{code.group(1)} ({first})" if code else first
        status = _STATUS.search(text)
        return BackendError(f"{self.b.target}: {action}: {type(exc).__name__}: {what}; allowed: "
                            + native_allowed(code.group(1) if code else None,
                                             int(status.group(1)) if status else None,
                                             self.b.limits()))

    def open_write(self, key: str, size: int) -> WriteHandle:
        return ObstoreWriter(self, key, size)

    def open_read(self, key: str, plan: Sequence[tuple[int, int]] | None = None
                  ) -> ReadHandle:
        return ReadAhead(lambda off, n: self.pool.submit(self.get, key, off, n), self.range,
                         self.b.concurrency, plan=plan)

    def get(self, key: str, offset: int, length: int) -> Chunk:
        try:
            res = obstore.get(self.store, self.b.object_key(key),
                              options={"range": (offset, offset + length)})
            data = res.bytes()
        except Exception as exc:
            if "range" in str(exc).lower() and "not satisfiable" in str(exc).lower():
                return Chunk(b"", 0, offset)
            if isinstance(exc, FileNotFoundError):
                raise BackendError(f"{self.b.target}: read {key}: no such object") from None
            raise self.fail(f"read {key}", exc) from None
        return Chunk(data, len(data), int(res.meta["size"]))


class ObstoreWriter(WriteHandle):
    def __init__(self, t: ObstoreTransport, key: str, size: int) -> None:
        self.t = t
        self.name = key
        self.size = size
        self.received = 0
        self.done = False
        part = t.b.part_size_for(size)
        try:
            self.file = obstore.open_writer(t.store, t.b.object_key(key), buffer_size=part,
                                            max_concurrency=t.b.concurrency)
        except Exception as exc:
            raise t.fail(f"start the upload of {key}", exc) from None

    def write(self, data: memoryview) -> None:
        view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
        view = view[:max(0, self.size - self.received)]
        self.received += len(view)
        if len(view):
            try:
                # bytes: obstore keeps a reference to what it is given until it sends it,
                # and the runner reuses its buffer as soon as write() returns
                self.file.write(bytes(view))
            except Exception as exc:
                raise self.t.fail(f"upload {self.name}", exc) from None

    def sync(self) -> None:
        if self.done:
            return
        try:
            self.file.close()
        except Exception as exc:
            raise self.t.fail(f"complete the upload of {self.name}", exc) from None
        self.done = True

    def close(self) -> None:
        pass

    def abort(self) -> None:
        """Drop the writer and abort what it left unfinished (obstore has no abort)."""
        self.done = True
        del self.file
        with contextlib.suppress(Exception):  # best effort; remove_tree retries it
            self.t.b.abort_uploads([self.name])
