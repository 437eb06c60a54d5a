"""Saving an object: a multipart upload, or one PUT for an object of at most one part.

``open_write`` starts a multipart upload when the object is larger than one part; ``write``
copies the runner's blocks into part buffers (or, for whole parts in the caller's buffer,
sends them in place) and uploads full parts, up to ``concurrency`` in flight per object;
``sync`` waits for them and completes the upload (an object of at most one part is one
``PutObject`` at ``sync``). Either way the object exists, whole, exactly when ``sync``
returns: S3's durability point.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, cast

from ckptbench.backends.base import WriteHandle
from ckptbench.backends.s3.client import ProcessState
from ckptbench.backends.s3.options import MIB
from ckptbench.backends.s3.window import backing_off

if TYPE_CHECKING:
    from ckptbench.backends.s3.session import S3Session

SPARE_BUFFERS = 512 * MIB  # spare part buffers kept per process, at most


# --- part buffers (reused: a fresh bytearray costs a memset and page faults) ---
def take_buffer(proc: ProcessState, part_size: int, n: int) -> bytearray:
    if n == part_size:
        with proc.lock:  # part sizes differ by object: take only a buffer of this size
            if proc.buffers and len(proc.buffers[-1]) == n:
                return proc.buffers.pop()
    return bytearray(n)


def give_buffer(proc: ProcessState, part_size: int, buf: bytearray) -> None:
    if len(buf) != part_size:
        return
    with proc.lock:
        if len(proc.buffers) * part_size < SPARE_BUFFERS:
            proc.buffers.append(buf)


def request_body(buf: bytearray | memoryview, n: int, zero_copy: bool) -> Any:
    """The first n bytes of `buf` as a request body: read in place (:class:`ViewBody`),
    or, when botocore must see bytes, a whole bytearray as it is, other memory copied.
    A ViewBody is sent 1 MiB per send, each bounded by the send timeout (client.
    send_timeout); a bytearray is one send, bounded as a whole, which sets a floor on
    each part's rate (64 MiB in 60 s), one a loaded endpoint can go below."""
    if zero_copy:
        return ViewBody(memoryview(buf)[:n])
    if n == len(buf) and isinstance(buf, bytearray):
        return buf
    return bytes(memoryview(buf)[:n])


class S3Writer(WriteHandle):
    def __init__(self, backend: S3Session, key: str, size: int) -> None:
        self.b = backend
        self.name = key
        self.key = backend.object_key(key)
        self.size = size
        self.part_size = backend.part_size_for(size)
        self.multipart = size > self.part_size
        self.buf: bytearray | None = None
        self.fill = 0
        self.received = 0
        self.next_part = 1
        self.parts: list[dict[str, Any]] = []
        self.pending: set[Future[dict[str, Any]]] = set()
        self.pool: ThreadPoolExecutor | None = None
        self.upload_id: str | None = None
        self.done = False
        self.client = backend.client()
        if self.multipart:
            extra = {"ChecksumAlgorithm": "CRC32"} if backend.checksum == "when_supported" else {}
            with backend.calls(f"start the upload of {key}"):
                resp = self.client.create_multipart_upload(Bucket=backend.bucket, Key=self.key,
                                                           **extra)
            self.upload_id = resp["UploadId"]

    def write(self, data: memoryview) -> None:
        view = memoryview(data).cast("B") if memoryview(data).format != "B" else memoryview(data)
        view = view[:max(0, self.size - self.received)]  # never past the object's size
        self.received += len(view)
        borrowed: list[Future[dict[str, Any]]] = []  # parts sent from the caller's buffer
        try:
            while len(view):
                if self.buf is None:
                    start = (self.next_part - 1) * self.part_size
                    want = min(self.part_size, self.size - start)
                    if self.b.zero_copy and len(view) >= want:
                        # A whole part (or the whole object) is in the caller's buffer: sent
                        # from there, not copied; the caller gets it back once it is stored.
                        if self.multipart:
                            borrowed.append(self._submit(view[:want], want, pooled=False))
                        else:
                            self._put(request_body(view, want, self.b.zero_copy))
                        view = view[want:]
                        continue
                    # sized to what this part will hold: sent whole, no second copy
                    self.buf = take_buffer(self.b.process(), self.part_size, want)
                    self.fill = 0
                n = min(len(view), len(self.buf) - self.fill)
                # Through a memoryview: bytearray slice assignment from a non-bytearray makes
                # a temporary copy of the source first (a second copy, and fresh pages to fault).
                memoryview(self.buf)[self.fill:self.fill + n] = view[:n]
                self.fill += n
                view = view[n:]
                if self.multipart and self.fill == len(self.buf):
                    self._send_part()
        finally:
            if borrowed:  # no part may still read the caller's buffer when we return
                wait(borrowed)
        self._harvest(block=False)

    def _harvest(self, block: bool) -> None:
        if not self.pending:
            return
        done, _ = wait(self.pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for fut in done:
            self.pending.discard(fut)
            self.parts.append(fut.result())  # raises the part's BackendError

    def _send_part(self) -> None:
        """Upload the filled part buffer (returned to the pool once sent)."""
        assert self.buf is not None
        buf, n = self.buf, self.fill
        self.buf, self.fill = None, 0
        self._submit(buf, n, pooled=True)

    def _submit(self, body: bytearray | memoryview, n: int, pooled: bool) -> Future[dict[str, Any]]:
        """Start uploading the next part, at most `concurrency` parts in flight."""
        assert self.upload_id is not None
        self._harvest(block=False)
        while len(self.pending) >= self.b.concurrency:
            self._harvest(block=True)
        number = self.next_part
        self.next_part += 1
        if self.b.concurrency == 1:
            # One part in flight: the calling thread sends it itself (no pool thread to
            # start per object, no two thread handoffs per part).
            done: Future[dict[str, Any]] = Future()
            try:
                done.set_result(self._upload_part(number, body, n, pooled))
            except BaseException as exc:
                done.set_exception(exc)
            self.pending.add(done)
            return done
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.b.concurrency, thread_name_prefix="ckptbench-s3")
        fut = self.pool.submit(self._upload_part, number, body, n, pooled)
        self.pending.add(fut)
        return fut

    def _upload_part(self, number: int, buf: bytearray | memoryview, n: int,
                     pooled: bool) -> dict[str, Any]:
        try:
            with self.b.calls(f"upload part {number} of {self.name}"):
                resp = backing_off(
                    self.b.process().window, lambda: self.client.upload_part(
                        Bucket=self.b.bucket, Key=self.key, UploadId=self.upload_id,
                        PartNumber=number, Body=request_body(buf, n, self.b.zero_copy)),
                    self.b.max_attempts, lambda: self.done)
            part = {"PartNumber": number, "ETag": resp["ETag"]}
            if resp.get("ChecksumCRC32"):
                part["ChecksumCRC32"] = resp["ChecksumCRC32"]
            return part
        finally:
            if pooled:
                give_buffer(self.b.process(), self.part_size, cast(bytearray, buf))

    def _put(self, body: Any) -> None:
        """The whole object in one PUT."""
        with self.b.calls(f"put {self.name}"):
            self.client.put_object(Bucket=self.b.bucket, Key=self.key, Body=body)
        self.done = True

    def sync(self) -> None:
        if self.done:
            return
        b = self.b
        if not self.multipart:
            self._put(b"" if self.buf is None else request_body(self.buf, self.fill, b.zero_copy))
        else:
            if self.fill:
                self._send_part()
            while self.pending:
                self._harvest(block=True)
            parts = sorted(self.parts, key=lambda p: p["PartNumber"])
            with b.calls(f"complete the upload of {self.name}"):
                self.client.complete_multipart_upload(
                    Bucket=b.bucket, Key=self.key, UploadId=self.upload_id,
                    MultipartUpload={"Parts": parts})
        self.done = True
        self._free()

    def _free(self, wait: bool = True) -> None:
        if self.buf is not None:
            give_buffer(self.b.process(), self.part_size, self.buf)
            self.buf = None
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None

    def close(self) -> None:
        self._free()

    def abort(self) -> None:
        for fut in self.pending:
            fut.cancel()
        # Parts still in flight are not waited for (each is bounded by the client's
        # timeouts, and the upload is aborted under them): a failing save ends now.
        self._free(wait=False)
        self.pending.clear()
        if self.upload_id and not self.done:
            with contextlib.suppress(Exception):  # best effort; remove_tree retries it
                self.b.cleanup_client().abort_multipart_upload(
                    Bucket=self.b.bucket, Key=self.key, UploadId=self.upload_id)
            self.done = True


class ViewBody:
    """A request body read in place from memory the caller owns, without a copy.

    botocore takes bytes, bytearray or a file: a memoryview fails its parameter check, and
    a retry would try to rewind it. As a file, botocore hashes it for the signature and
    seeks back, urllib3 sends what read() returns, and a retry rewinds it. read() hands out
    at least 1 MiB at a time, views not copies, so a 64 MiB body is 64 sends, not 4,096."""

    CHUNK = 1 * MIB

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.pos = 0

    def __len__(self) -> int:
        return len(self.view)

    def read(self, amt: int | None = -1) -> memoryview:
        end = len(self.view) if amt is None or amt < 0 else min(
            len(self.view), self.pos + max(amt, self.CHUNK))
        out = self.view[self.pos:end]
        self.pos = end
        return out

    def readinto(self, buf: memoryview | bytearray) -> int:
        """Fill `buf` (never more than it holds): how awscrt reads a body when it is
        installed and botocore signs through it (read() hands out more than asked)."""
        n = min(len(buf), len(self.view) - self.pos)
        memoryview(buf).cast("B")[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.view)}[whence]
        self.pos = min(max(0, base + pos), len(self.view))
        return self.pos

    def tell(self) -> int:
        return self.pos
