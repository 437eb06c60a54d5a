"""``--s3-transport crt``: object data through the AWS Common Runtime's S3 client
(``awscrt.s3``, the engine of boto3's CRT transfer manager and the AWS CLI v2).

Uploads are one CRT PUT meta-request per object: the CRT splits it into parts, signs and
sends them on its own native threads, and aborts the multipart upload when the request
fails or is cancelled. The runner's blocks reach it through :class:`Feed`, a stream the
CRT reads each part from (one copy, into the CRT's part buffer). Restores are ranged GETs
issued ahead of the reader (:mod:`.readahead`), each a CRT GET meta-request.

Credentials come from boto3's standard chain (a delegate provider asks boto3 each time the
CRT signs); retries are the CRT's (standard mode, ``--s3-max-attempts``), which its Python
binding does not report: the records say ``retries_counted: false``.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from awscrt import auth, http, io, s3

from ckptbench.backends.base import ReadHandle, WriteHandle
from ckptbench.backends.s3.errors import native_allowed
from ckptbench.backends.s3.readahead import Chunk, ReadAhead
from ckptbench.backends.s3.sizing import PART_RANGE
from ckptbench.backends.s3.transport import Address, credentials
from ckptbench.errors import BackendError

if TYPE_CHECKING:
    from ckptbench.backends.s3.session import S3Session

_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
# The CRT's part size for GETs (its own default): a 16 MiB range is two parts. With the
# range as one part its buffer pool mapped fresh memory for every GET (a page fault per
# 4 KiB read: 1.5 CPU s/GB here, against 0.9 with 8 MiB parts).
GET_PART = 8 << 20
_TOTAL = re.compile(r"/(\d+)$")


def make(backend: S3Session) -> CrtTransport:
    return CrtTransport(backend)


class CrtTransport:
    def __init__(self, backend: S3Session) -> None:
        o = backend.options
        if o.payload_signing == "on":
            raise BackendError(f"{backend.target}: --s3-transport crt sends UNSIGNED-PAYLOAD; "
                               "allowed with it: --s3-payload-signing auto or off")
        self.b = backend
        self.addr = Address.of(backend)
        region = backend.clients.resolve().region
        elg = io.EventLoopGroup()
        bootstrap = io.ClientBootstrap(elg, io.DefaultHostResolver(elg))
        provider = auth.AwsCredentialsProvider.new_delegate(self._keys)
        signing = s3.create_default_s3_signing_config(region=region, credential_provider=provider)
        retry = (s3.S3RetryConfig(max_retries=o.max_attempts - 1) if o.max_attempts > 1
                 else s3.S3RetryConfig(retry_mode=s3.S3RetryMode.NONE))
        tls = (s3.S3RequestTlsMode.DISABLED if self.addr.scheme == "http"
               else s3.S3RequestTlsMode.ENABLED)
        self.client = s3.S3Client(
            bootstrap=bootstrap, region=region, signing_config=signing, tls_mode=tls,
            part_size=GET_PART, retry_config=retry,
            connect_timeout_ms=int(o.connect_timeout * 1000),
            # connections: the CRT opens about throughput_target_gbps * 2.5 of them
            throughput_target_gbps=max(1.0, backend.concurrency * backend.hints.threads / 2.5))
        self.range = PART_RANGE[0]
        self.lock = threading.Lock()
        self.spare: list[bytearray] = []
        self.checksum = (s3.S3ChecksumConfig(algorithm=s3.S3ChecksumAlgorithm.CRC32,
                                             location=s3.S3ChecksumLocation.TRAILER,
                                             validate_response=True)
                         if o.checksum == "when_supported" else None)

    def _keys(self) -> auth.AwsCredentials:
        c = credentials(self.b)
        return auth.AwsCredentials(c.access_key, c.secret_key, c.token)

    def request(self, method: str, key: str, headers: list[tuple[str, str]],
                body: Any = None) -> http.HttpRequest:
        h = http.HttpHeaders([("Host", self.addr.netloc), *headers])
        return http.HttpRequest(method, self.addr.path(self.b.object_key(key)), h, body)

    def fail(self, action: str, error: BaseException | None, status: int | None,
             body: bytes | None) -> BackendError:
        """One line: the S3 error code and HTTP status, or the CRT's error name."""
        code = _CODE.search(body or b"")
        s3_code = code.group(1).decode(errors="replace") if code else None
        what = s3_code or getattr(error, "name", None) or type(error).__name__
        status_text = f" (HTTP {status})" if status else ""
        return BackendError(f"{self.b.target}: {action}: {what}{status_text}; allowed: "
                            + native_allowed(s3_code, status, self.b.limits()))

    def _buffer(self, n: int) -> bytearray:
        """A read-ahead buffer: reused (a fresh one costs a memset and page faults)."""
        with self.lock:
            if n == self.range and self.spare:
                return self.spare.pop()
        return bytearray(n)

    def _give(self, buf: bytearray) -> None:
        with self.lock:
            if len(buf) == self.range and len(self.spare) < 4 * self.b.concurrency:
                self.spare.append(buf)

    def open_write(self, key: str, size: int) -> WriteHandle:
        return CrtWriter(self, key, size)

    def open_read(self, key: str, plan: Sequence[tuple[int, int]] | None = None
                  ) -> ReadHandle:
        return ReadAhead(lambda off, n: self.get(key, off, n), self.range,
                         self.b.concurrency, plan=plan)

    def get(self, key: str, offset: int, length: int) -> Future[Chunk]:
        """One ranged GET into a fresh buffer; an offset past the end gives 0 bytes."""
        out: Future[Chunk] = Future()
        start = offset
        buf = self._buffer(length)
        view = memoryview(buf)
        got = [0]
        total = [offset + length]

        def on_headers(status_code: int, headers: list[tuple[str, str]], **_: Any) -> None:
            for name, value in headers:
                if name.lower() == "content-range" and (m := _TOTAL.search(value)):
                    total[0] = int(m.group(1))

        def on_body(chunk: Any, offset: int, **_: Any) -> None:
            at = offset - start  # the CRT gives offsets in the object, not in the range
            n = len(chunk)
            view[at:at + n] = chunk
            got[0] = max(got[0], at + n)

        def on_done(error: BaseException | None = None, status_code: int | None = None,
                    error_body: bytes | None = None, **_: Any) -> None:
            if error is None:
                out.set_result(Chunk(buf, got[0], total[0], lambda: self._give(buf)))
            elif status_code == 416:
                out.set_result(Chunk(buf, 0, offset))
            else:
                out.set_exception(self.fail(f"read {key}", error, status_code, error_body))

        req = self.request("GET", key, [("Range", f"bytes={offset}-{offset + length - 1}")])
        self.client.make_request(type=s3.S3RequestType.GET_OBJECT, request=req,
                                 part_size=GET_PART, on_headers=on_headers,
                                 checksum_config=self.checksum,
                                 on_body=on_body, on_done=on_done)
        return out


class Feed:
    """The body of an upload, fed by the runner's writes and read by CRT threads: write()
    returns once the CRT has copied the caller's block (the caller reuses it)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pieces: collections.deque[memoryview] = collections.deque()
        self.eof = False
        self.failed = False

    def readinto(self, m: memoryview) -> int:
        with self.cond:
            while not self.pieces and not self.eof and not self.failed:
                self.cond.wait()
            if self.failed:
                raise OSError("upload cancelled")
            if not self.pieces:
                return 0
            piece = self.pieces[0]
            n = min(len(m), len(piece))
            m[:n] = piece[:n]
            if n == len(piece):
                self.pieces.popleft()
                self.cond.notify_all()
            else:
                self.pieces[0] = piece[n:]
            return n

    def read(self, n: int = -1) -> bytes:  # the CRT's stream wrapper wants one; it uses readinto
        buf = bytearray(max(0, n))
        return bytes(buf[:self.readinto(memoryview(buf))])

    def push(self, view: memoryview) -> None:
        with self.cond:
            self.pieces.append(view)
            self.cond.notify_all()
            while self.pieces and not self.failed:
                self.cond.wait()

    def end(self, failed: bool = False) -> None:
        with self.cond:
            self.eof = True
            self.failed = self.failed or failed
            if failed:
                self.pieces.clear()
            self.cond.notify_all()


class CrtWriter(WriteHandle):
    def __init__(self, t: CrtTransport, key: str, size: int) -> None:
        self.t = t
        self.name = key
        self.size = size
        self.received = 0
        self.feed = Feed()
        self.done: Future[None] = Future()
        part = t.b.part_size_for(size)

        def on_done(error: BaseException | None = None, status_code: int | None = None,
                    error_body: bytes | None = None, **_: Any) -> None:
            self.feed.end(failed=error is not None)
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(t.fail(f"put {key}", error, status_code, error_body))

        req = t.request("PUT", key, [("Content-Length", str(size)),
                                     ("Content-Type", "application/octet-stream")], self.feed)
        self.req = t.client.make_request(type=s3.S3RequestType.PUT_OBJECT, request=req,
                                         part_size=part, multipart_upload_threshold=part,
                                         checksum_config=t.checksum,
                                         on_done=on_done)

    def write(self, data: memoryview) -> None:
        view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
        view = view[:max(0, self.size - self.received)]
        self.received += len(view)
        if len(view):
            self.feed.push(view)
        failure = self.done.exception() if self.done.done() else None
        if failure is not None:
            raise failure

    def sync(self) -> None:
        self.feed.end()
        self.done.result()

    def close(self) -> None:
        self.feed.end()

    def abort(self) -> None:
        """Cancel the upload: the CRT aborts its multipart upload."""
        self.feed.end(failed=True)
        if not self.done.done():
            self.req.cancel()
        self.done.exception()  # wait until the CRT has finished with the upload
