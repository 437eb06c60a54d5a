"""Restoring: one ranged GET, or ``concurrency`` parallel ranged GETs for a large buffer,
read straight from the socket into the runner's buffer (no copy) when the body is a plain
length-delimited stream. A body cut after the headers is retried here: botocore's own
retries end when the response headers arrive.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ckptbench.backends.base import ReadHandle
from ckptbench.backends.s3.errors import backoff, is_connection_error
from ckptbench.backends.s3.options import MIB, MIN_RANGE
from ckptbench.backends.s3.window import backing_off
from ckptbench.errors import BackendError

if TYPE_CHECKING:
    from ckptbench.backends.s3.session import S3Session


class _BodyCut(Exception):
    """A body cut after its headers (retried by S3Reader.get_range, not by botocore)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class S3Reader(ReadHandle):
    def __init__(self, backend: S3Session, key: str) -> None:
        self.b = backend
        self.name = key
        self.key = backend.object_key(key)
        self.client = backend.client()
        self.pool: ThreadPoolExecutor | None = None

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B") if memoryview(buf).format != "B" else memoryview(buf)
        n = len(view)
        if n == 0:
            return 0
        k = max(1, min(self.b.concurrency, n // MIN_RANGE))
        if k == 1:
            return self.get_range(offset, view)
        step = -(-n // k)
        pieces = [(offset + s, view[s:s + step]) for s in range(0, n, step)]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.b.concurrency, thread_name_prefix="ckptbench-s3")
        futures = [self.pool.submit(self.get_range, off, piece) for off, piece in pieces[1:]]
        got = [self.get_range(*pieces[0])]
        got += [f.result() for f in futures]
        total = 0
        for (_, piece), g in zip(pieces, got, strict=True):
            total += g
            if g < len(piece):  # the object ended inside this piece
                break
        return total

    def get_range(self, offset: int, view: memoryview, size: list[int] | None = None) -> int:
        """One ranged GET into `view`: the unit the read-ahead issues into its staging
        buffers (readinto splits a large read into several). It takes a place of the
        process's window (narrowed while the endpoint pushes back, as for saves:
        window.backing_off); body errors (after the headers) are retried here, since
        botocore's retries end when the response headers arrive. `size`, where given and
        empty, gets the object's size from the response's Content-Range."""
        b = self.b
        window = b.process().window
        for attempt in range(1, b.max_attempts + 1):
            try:
                with b.calls(f"read {self.name}"):
                    return backing_off(window, lambda: self._get(offset, view, size),
                                       b.max_attempts)
            except _BodyCut as cut:
                if attempt >= b.max_attempts:
                    b.process().stopped_answering()
                    raise b.error(cut.exc, f"read {self.name}") from None
                b.process().count("retries")
                b.process().count("retries_connection")
                window.congested()
                backoff(attempt)
        raise AssertionError("unreachable")

    def _get(self, offset: int, view: memoryview, size: list[int] | None) -> int:
        """One attempt: the GET (botocore's retries until the headers) and its body."""
        from botocore.exceptions import ClientError

        b = self.b
        try:
            resp = self.client.get_object(Bucket=b.bucket, Key=self.key,
                                          Range=f"bytes={offset}-{offset + len(view) - 1}")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidRange":
                return 0  # offset at or past the end of the object
            if code in ("NoSuchKey", "404"):
                raise BackendError(f"{b.target}: read {self.name}: no such object") from None
            raise
        length = int(resp.get("ContentLength", 0))
        total = str(resp.get("ContentRange", "")).rpartition("/")[2]
        if size is not None and not size and total.isdigit():
            size.append(int(total))
        if length > len(view):
            resp["Body"].close()
            raise BackendError(f"{b.target}: read {self.name}: the endpoint ignored the byte "
                               "range (sent more than asked); allowed: an S3 API with ranged GET")
        try:
            return _read_body(resp["Body"], view[:length])
        except Exception as exc:
            if is_connection_error(exc):
                raise _BodyCut(exc) from None
            raise b.error(exc, f"read {self.name}") from None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None


def _read_body(body: Any, view: memoryview) -> int:
    """Read a whole response body into `view`: straight from the socket when the body is a
    plain, length-delimited stream (no copy), else through botocore (which may verify a
    checksum)."""
    from botocore.response import StreamingBody

    want = len(view)
    got = 0
    raw: Any = getattr(body, "_raw_stream", None)  # urllib3's response
    fp: Any = getattr(raw, "_fp", None)  # http.client's response: readinto() from the socket
    plain = (type(body) is StreamingBody and raw is not None and hasattr(fp, "readinto")
             and not getattr(raw, "chunked", False)
             and not raw.headers.get("content-encoding"))

    def drop() -> None:  # a body not read to its end: its connection is not reused
        with contextlib.suppress(Exception):
            (raw or body).close()

    try:
        if plain:
            while got < want:
                n = fp.readinto(view[got:])
                if not n:
                    break
                got += n
        else:
            while got < want:
                chunk = body.read(min(want - got, 8 * MIB))
                if not chunk:
                    break
                view[got:got + len(chunk)] = chunk
                got += len(chunk)
    except BaseException:
        drop()
        raise
    if got < want:
        drop()
        import http.client

        raise http.client.IncompleteRead(b"", want - got)
    if plain:
        raw.release_conn()
    else:
        body.close()
    return got
