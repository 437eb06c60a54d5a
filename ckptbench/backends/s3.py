"""S3 and S3-compatible object stores (AWS S3, MinIO, Ceph RGW, ...) through boto3.

Targets are ``s3://bucket/prefix``. The endpoint comes from ``--endpoint-url`` or boto3's
standard configuration (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the config file);
credentials come only from boto3's standard chain and are never stored, recorded or
printed.

Saving an object: ``open_write`` starts a multipart upload when the object is larger than
one part; ``write`` copies the runner's blocks into part buffers and uploads full parts,
up to ``concurrency`` in flight per object; ``sync`` waits for them and completes the
upload (an object of at most one part is one ``PutObject`` at ``sync``). Either way the
object exists, whole, exactly when ``sync`` returns: S3's durability point.

Restoring: ``readinto`` is one ranged GET, or ``concurrency`` parallel ranged GETs for a
large buffer, read straight from the socket into the runner's buffer.

Requests go through the classic botocore client (never the CRT transfer client, which has
been reported to ignore a custom endpoint). Retries use botocore's ``standard`` mode; each
retried request is counted, by reason, in :meth:`S3Backend.stats` (and so in the records).
Clients are made lazily per process: the runner forks ranks after ``prepare``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import random
import re
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar, cast
from urllib.parse import urlsplit, urlunsplit

from ckptbench.backends.base import TARGET_MARKER, Backend, ReadHandle, WriteHandle, marker_bytes
from ckptbench.errors import BackendError

MIB = 1 << 20
MIN_PART = 5 * MIB  # S3: every part but the last is at least 5 MiB ...
MAX_PART = 5 << 30  # ... and at most 5 GiB,
MAX_PARTS = 10_000  # and an upload has at most 10,000 parts.
MIN_RANGE = 4 * MIB  # a read buffer is split into parallel ranged GETs of at least this size
CHECKSUM_MODES = ("when_required", "when_supported")
PAYLOAD_SIGNING = ("auto", "on", "off")
DEFAULTS: dict[str, Any] = {
    "endpoint_url": None,
    "part_size": 8 * MIB,
    "concurrency": 8,  # parts in flight per object; ranged GETs per read
    "io_threads": 1,  # the runner's I/O threads per process (sizes the connection pool)
    "checksum": "when_required",
    "payload_signing": "auto",
    "max_attempts": 3,  # botocore standard mode's default: 1 try + 2 retries
    "connect_timeout": 5.0,
    "read_timeout": 60.0,
}
STAT_KEYS = ("requests", "retries", "retries_throttle", "retries_server", "retries_connection",
             "retries_other", "cleanup_errors")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")
_THROTTLE = {"SlowDown", "Throttling", "ThrottlingException", "RequestThrottled",
             "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
             "ProvisionedThroughputExceededException", "BandwidthLimitExceeded"}
CHAIN = ("credentials from boto3's standard chain (AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY, "
         "AWS_PROFILE, ~/.aws/credentials, an instance or container role)")
ENDPOINT_HINT = "a reachable endpoint from --endpoint-url or AWS_ENDPOINT_URL_S3"


def parse_target(target: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix/' -> ('bucket', 'some/prefix')."""
    if not target.startswith("s3://"):
        raise BackendError(f"target {target}: not an s3:// URL; allowed: s3://bucket/prefix")
    bucket, _, prefix = target[len("s3://"):].partition("/")
    if not _BUCKET.match(bucket):
        raise BackendError(f"target {target}: {bucket!r} is not a bucket name; allowed: "
                           "s3://bucket/prefix with a bucket of 3-255 lowercase letters, digits, '.-_'")
    prefix = "/".join(p for p in prefix.split("/") if p)
    if any(p in (".", "..") for p in prefix.split("/")):
        raise BackendError(f"target {target}: '.' and '..' are not allowed in the prefix")
    return bucket, prefix


def public_endpoint(url: str | None) -> str | None:
    """The endpoint without user:password@ (never recorded, even if someone put it there)."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


@functools.cache
def user_agent() -> str:
    """ckptbench's User-Agent: the tool and the versions a server operator would ask for."""
    import platform

    import botocore

    from ckptbench import __version__

    return (f"ckptbench/{__version__} botocore/{botocore.__version__} "
            f"Python/{platform.python_version()}")


def _is_aws(endpoint: str) -> bool:
    host = urlsplit(endpoint).hostname or ""
    return host.endswith(".amazonaws.com") or host.endswith(".amazonaws.com.cn")


class _Process:
    """What one process owns: its clients, counters and spare part buffers (never forked)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.clients: dict[str, Any] = {}
        self.session: Any = None  # one boto3 session: its loader parses the S3 model once
        self.counters: collections.Counter[str] = collections.Counter()
        self.buffers: list[bytearray] = []
        self.dead = False  # the endpoint stopped answering: cleanup tries once, quickly

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] += n


_STATE_LOCK = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_STATE_LOCK", threading.Lock()))


class S3Backend(Backend):
    name = "s3"
    capabilities: ClassVar[frozenset[str]] = frozenset({"multipart", "ranged_read"})

    def __init__(self, target: str, options: dict[str, Any] | None = None) -> None:
        given = {k: v for k, v in (options or {}).items() if v is not None}
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            raise BackendError(f"s3 backend: unknown option {unknown[0]!r}; allowed: "
                               f"{', '.join(DEFAULTS)}")
        super().__init__(target, {**DEFAULTS, **given})
        self.bucket, self.prefix = parse_target(target)
        o = self.options
        self.part_size = int(o["part_size"])
        if not MIN_PART <= self.part_size <= MAX_PART:
            raise BackendError(f"--part-size {self.part_size}: S3 parts must be 5 MiB to 5 GiB; "
                               "allowed: e.g. 8MiB, 64MiB")
        self.concurrency = int(o["concurrency"])
        if self.concurrency < 1:
            raise BackendError(f"--s3-concurrency {self.concurrency}: allowed: 1 or more")
        self.io_threads = max(1, int(o["io_threads"]))
        self.checksum = o["checksum"]
        if self.checksum not in CHECKSUM_MODES:
            raise BackendError(f"--s3-checksum {self.checksum!r}; allowed: {', '.join(CHECKSUM_MODES)}")
        self.payload_signing = o["payload_signing"]
        if self.payload_signing not in PAYLOAD_SIGNING:
            raise BackendError(f"--s3-payload-signing {self.payload_signing!r}; allowed: "
                               f"{', '.join(PAYLOAD_SIGNING)}")
        # Bodies are sent from the caller's memory rather than copied into bytes (see
        # _ViewBody); botocore's CRC32 request checksums want bytes, so --s3-checksum
        # when_supported copies.
        self.zero_copy = self.checksum == "when_required"
        self.max_attempts = int(o["max_attempts"])
        if self.max_attempts < 1:
            raise BackendError(f"--s3-max-attempts {self.max_attempts}: allowed: 1 or more")
        endpoint = o["endpoint_url"]
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise BackendError(f"--endpoint-url {public_endpoint(endpoint)!r}: allowed: an "
                               "http:// or https:// URL")
        self.created_marker = False
        self._state: _Process | None = None
        self._resolved: dict[str, Any] | None = None  # endpoint, region, addressing style

    # --- keys and processes ---
    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _proc(self) -> _Process:
        state = self._state
        if state is None or state.pid != os.getpid():
            with _STATE_LOCK:
                state = self._state
                if state is None or state.pid != os.getpid():
                    state = self._state = _Process()
        return state

    def _session(self) -> Any:
        proc = self._proc()
        if proc.session is None:
            import boto3

            with proc.lock:
                if proc.session is None:
                    proc.session = boto3.session.Session()
        return proc.session

    def _resolve(self) -> dict[str, Any]:
        """Endpoint, region and addressing style, once (children inherit the answer)."""
        if self._resolved is None:
            session = self._session()
            region = session.region_name or "us-east-1"  # no IMDS region lookup
            with self._proc().lock:  # a boto3 session makes clients one at a time
                probe = session.client("s3", endpoint_url=self.options["endpoint_url"],
                                       region_name=region)
            endpoint = probe.meta.endpoint_url
            self._resolved = {"endpoint": endpoint, "region": region,
                              "addressing_style": "auto" if _is_aws(endpoint) else "path"}
        return self._resolved

    def _client(self, kind: str = "main") -> Any:
        """This process's client: 'main' (the configured retries and timeouts) or 'quick'
        (2 attempts, 2 s to connect: probing the target, cleaning up after a failure)."""
        proc = self._proc()
        client = proc.clients.get(kind)
        if client is None:
            r = self._resolve()
            session = self._session()
            with proc.lock:
                client = proc.clients.get(kind)
                if client is None:
                    client = proc.clients[kind] = self._make_client(kind, proc, session, r)
        return client

    def _make_client(self, kind: str, proc: _Process, session: Any, r: dict[str, Any]) -> Any:
        from botocore.config import Config

        quick = kind == "quick"
        s3cfg: dict[str, Any] = {"addressing_style": r["addressing_style"]}
        if self.payload_signing != "auto":
            s3cfg["payload_signing_enabled"] = self.payload_signing == "on"
        config = Config(
            max_pool_connections=self.concurrency * self.io_threads + 4,
            # A fixed User-Agent: botocore otherwise rebuilds and sanitizes its own, character
            # by character, on every request; and no parameter validation (ckptbench builds
            # every request itself). With parts sent inline (_submit), ckptbench's CPU per GB
            # saved fell from 0.69 to 0.65 s here (docs/s3.md): CPU a small server gets back.
            user_agent=user_agent(),
            parameter_validation=False,
            connect_timeout=2.0 if quick else float(self.options["connect_timeout"]),
            read_timeout=10.0 if quick else float(self.options["read_timeout"]),
            # total_max_attempts counts the first try; botocore's max_attempts counts retries.
            retries={"mode": "standard",
                     "total_max_attempts": min(2, self.max_attempts) if quick else self.max_attempts},
            request_checksum_calculation=self.checksum,
            response_checksum_validation=self.checksum,
            s3=s3cfg,
        )
        client = session.client(
            "s3", endpoint_url=self.options["endpoint_url"], region_name=r["region"], config=config)
        events = client.meta.events
        events.register("needs-retry.s3", _note_retry_reason)
        events.register("request-created.s3", lambda request, **kw: _count_attempt(proc, request))
        return client

    # --- errors ---
    def error(self, exc: BaseException, action: str) -> BackendError:
        """One line for the usual ways S3 says no (never a key, never a traceback)."""
        from botocore.exceptions import (
            ClientError,
            ConnectTimeoutError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
            ReadTimeoutError,
        )

        endpoint = public_endpoint((self._resolved or {}).get("endpoint")
                                   or self.options["endpoint_url"]) or "the default S3 endpoint"
        where = f"{self.target}: {action}"
        if isinstance(exc, BackendError):
            return exc
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                        "ExpiredToken", "InvalidClientTokenId"):
                what = {"InvalidAccessKeyId": "the access key is not known to the endpoint",
                        "SignatureDoesNotMatch": "the secret key does not match the access key"
                        }.get(code, "the session token is not valid")
                return BackendError(f"{where}: wrong credentials ({code}: {what}); allowed: {CHAIN}")
            if code in ("AccessDenied", "403", "Forbidden", "AllAccessDisabled"):
                return BackendError(f"{where}: access denied ({code}); allowed: credentials that may "
                                    f"list, read, write and delete under the prefix, from {CHAIN}")
            if code in ("NoSuchBucket",) or (code == "404" and action.startswith("check")):
                return BackendError(f"{where}: bucket {self.bucket!r} does not exist at {endpoint}; "
                                    "allowed: an existing bucket (ckptbench never creates buckets)")
            if code in _THROTTLE or status == 429:
                return BackendError(f"{where}: the endpoint kept throttling ({code or status}) on "
                                    "every attempt; allowed: fewer ranks/threads or a larger "
                                    "--s3-max-attempts")
            if status and status >= 500:
                return BackendError(f"{where}: server error {status} {code} on every attempt at "
                                    f"{endpoint}")
            message = str(err.get("Message", ""))[:200]
            return BackendError(f"{where}: {code or status}: {message}".rstrip(": "))
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return BackendError(f"{where}: no usable credentials found; allowed: {CHAIN}")
        if isinstance(exc, EndpointConnectionError | ConnectTimeoutError):
            return BackendError(f"{where}: cannot reach the endpoint {endpoint} "
                                f"({type(exc).__name__}); allowed: {ENDPOINT_HINT}")
        if isinstance(exc, ReadTimeoutError):
            return BackendError(f"{where}: the endpoint {endpoint} did not answer within "
                                f"{self.options['read_timeout']} s")
        name = type(exc).__name__
        if _is_connection_error(exc):
            return BackendError(f"{where}: connection to {endpoint} lost ({name}) on every "
                                "attempt")
        return BackendError(f"{where}: {name}: {str(exc)[:200]}")

    @contextlib.contextmanager
    def calls(self, action: str) -> Any:
        """Map botocore's exceptions raised inside to one-line BackendErrors."""
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line
            if not (_is_boto_error(exc) or _is_connection_error(exc)):
                raise
            if _is_connection_error(exc):
                self._proc().dead = True
            raise self.error(exc, action) from None

    # --- the target ---
    @property
    def marker_key(self) -> str:
        return self._key(TARGET_MARKER)

    def prepare(self) -> None:
        base = f"{self.prefix}/" if self.prefix else ""
        with self.calls("check the target"):  # quick: an unreachable endpoint fails in seconds
            listing = self._client("quick").list_objects_v2(Bucket=self.bucket, Prefix=base,
                                                            MaxKeys=3)
        client = self._client("main")
        others = [o["Key"] for o in listing.get("Contents", []) if o["Key"] != self.marker_key]
        if self._head(self.marker_key, "check the target"):
            return
        if others:
            raise BackendError(
                f"target {self.target} holds objects not made by ckptbench (e.g. {others[0]!r}); "
                "allowed: a new or empty prefix, or one ckptbench marked before")
        with self.calls("mark the target"):
            client.put_object(Bucket=self.bucket, Key=self.marker_key, Body=marker_bytes())
        self.created_marker = True

    def release(self) -> None:
        if not self.created_marker:
            return
        base = f"{self.prefix}/" if self.prefix else ""
        client = self._client("quick" if self._proc().dead else "main")
        try:
            with self.calls("release the target"):
                listing = client.list_objects_v2(Bucket=self.bucket, Prefix=base, MaxKeys=3)
                if any(o["Key"] != self.marker_key for o in listing.get("Contents", [])):
                    return
                client.delete_object(Bucket=self.bucket, Key=self.marker_key)
                self.created_marker = False
        except BackendError:
            self._proc().count("cleanup_errors")

    def _head(self, key: str, action: str) -> bool:
        from botocore.exceptions import ClientError

        with self.calls(action):
            try:
                self._client().head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise
        return True

    # --- data ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        return _S3Writer(self, key, size)

    def open_read(self, key: str) -> ReadHandle:
        return _S3Reader(self, key)

    def put_atomic(self, key: str, data: bytes) -> None:
        # One PUT: readers see the whole object or none of it.
        with self.calls(f"put {key}"):
            self._client().put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        with self.calls(f"get {key}"):
            try:
                resp = self._client().get_object(Bucket=self.bucket, Key=self._key(key))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    raise FileNotFoundError(f"{self.target}/{key}") from None
                raise
            return bytes(resp["Body"].read())

    def exists(self, key: str) -> bool:
        return self._head(self._key(key), f"look up {key}")

    def remove_tree(self, prefix: str) -> None:
        """Delete every object (and unfinished upload) under `prefix`; best effort, like
        rmtree(ignore_errors=True): a failure is counted, never raised over the real error."""
        exact = self._key(prefix).rstrip("/")
        if not prefix.strip("/") or exact == self.marker_key:
            raise BackendError(f"{self.target}: refusing to remove the whole target")
        base = exact + "/"
        client = self._client("quick" if self._proc().dead else "main")
        try:
            with self.calls(f"remove {prefix}"):
                pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=exact)
                batch: list[dict[str, str]] = []
                for page in pages:
                    for obj in page.get("Contents", []):
                        if obj["Key"] != exact and not obj["Key"].startswith(base):
                            continue  # 'run-1' must not take 'run-10' with it
                        batch.append({"Key": obj["Key"]})
                        if len(batch) == 1000:
                            self._delete(client, batch)
                            batch = []
                if batch:
                    self._delete(client, batch)
                uploads = client.list_multipart_uploads(Bucket=self.bucket, Prefix=base)
                for up in uploads.get("Uploads", []):
                    client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"],
                                                  UploadId=up["UploadId"])
        except BackendError:
            self._proc().count("cleanup_errors")

    def _delete(self, client: Any, batch: list[dict[str, str]]) -> None:
        resp = client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        if resp.get("Errors"):
            self._proc().count("cleanup_errors", len(resp["Errors"]))

    def drop_cache(self, keys: list[str]) -> str:
        return "none (object store)"

    def stats(self) -> dict[str, int]:
        proc = self._proc()
        with proc.lock:
            out = {k: int(proc.counters.get(k, 0)) for k in STAT_KEYS}
            proc.counters.clear()
        return out

    def describe(self) -> dict[str, Any]:
        import boto3
        import botocore

        r = self._resolve()
        auth = None
        with contextlib.suppress(Exception):
            creds = self._session().get_credentials()
            auth = creds.method if creds is not None else None
        return {
            **super().describe(),
            "endpoint": public_endpoint(r["endpoint"]),
            "bucket": self.bucket,
            "prefix": self.prefix,
            "region": r["region"],
            "addressing_style": r["addressing_style"],
            "part_size": self.part_size,
            "concurrency": self.concurrency,
            "checksum": {"request": self.checksum, "response": self.checksum},
            "payload_signing": self.payload_signing,
            "retries": {"mode": "standard", "max_attempts": self.max_attempts},
            "transfer": "botocore client (classic; no CRT), own multipart and ranged GETs",
            "auth": auth,  # where boto3 found the credentials ('env', ...), never the keys
            "boto3": boto3.__version__,
            "botocore": botocore.__version__,
        }

    def public_options(self) -> dict[str, Any]:
        out = super().public_options()
        out["endpoint_url"] = public_endpoint(out.get("endpoint_url"))
        return out

    # --- part buffers (reused: a fresh bytearray costs a memset and page faults) ---
    def take_buffer(self, n: int) -> bytearray:
        proc = self._proc()
        if n == self.part_size:
            with proc.lock:
                if proc.buffers:
                    return proc.buffers.pop()
        return bytearray(n)

    def give_buffer(self, buf: bytearray) -> None:
        if len(buf) != self.part_size:
            return
        proc = self._proc()
        with proc.lock:
            if len(proc.buffers) * self.part_size < 512 * MIB:
                proc.buffers.append(buf)

    def body(self, buf: bytearray | memoryview, n: int) -> Any:
        """The first n bytes of `buf` as a request body: a bytearray as it is; other memory
        read in place (:class:`_ViewBody`) or, when botocore must see bytes, copied."""
        if n == len(buf) and isinstance(buf, bytearray):
            return buf
        return _ViewBody(memoryview(buf)[:n]) if self.zero_copy else bytes(memoryview(buf)[:n])

    def part_size_for(self, size: int) -> int:
        """The part size, raised for objects that would need more than 10,000 parts."""
        need = -(-size // MAX_PARTS)
        return max(self.part_size, -(-need // MIB) * MIB)

    def backoff(self, attempt: int) -> None:
        time.sleep(min(20.0, random.random() * (2 ** (attempt - 1))))


# --- retry accounting (botocore events) ---
def _note_retry_reason(response: Any = None, caught_exception: Any = None,
                       request_dict: Any = None, **_: Any) -> None:
    """needs-retry: remember why this attempt failed; the next attempt (if any) counts it."""
    if request_dict is None:
        return
    reason = None
    if caught_exception is not None:
        reason = "connection" if _is_connection_error(caught_exception) else "other"
    elif response is not None:
        http, parsed = response
        code = (parsed or {}).get("Error", {}).get("Code", "")
        status = getattr(http, "status_code", 0)
        if code in _THROTTLE or status == 429:
            reason = "throttle"
        elif status >= 500:
            reason = "server"
        elif status >= 400:
            reason = "other"
    request_dict.setdefault("context", {})["ckptbench_retry"] = reason


def _count_attempt(proc: _Process, request: Any) -> None:
    """request-created: once per attempt; attempt > 1 is a retry."""
    context = getattr(request, "context", {}) or {}
    attempt = context.get("retries", {}).get("attempt", 1)
    with proc.lock:
        if attempt <= 1:
            proc.counters["requests"] += 1
        else:
            proc.counters["retries"] += 1
            proc.counters[f"retries_{context.get('ckptbench_retry') or 'other'}"] += 1


def _is_boto_error(exc: BaseException) -> bool:
    mod = type(exc).__module__
    return mod.startswith(("botocore", "urllib3", "boto3", "http.client"))


def _is_connection_error(exc: BaseException) -> bool:
    import http.client

    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, ResponseStreamingError

    if isinstance(exc, BotoConnectionError | HTTPClientError | ResponseStreamingError
                  | http.client.HTTPException | ConnectionError | TimeoutError):
        return True
    return type(exc).__module__.startswith("urllib3")


# --- handles ---
class _S3Writer(WriteHandle):
    def __init__(self, backend: S3Backend, key: str, size: int) -> None:
        self.b = backend
        self.name = key
        self.key = backend._key(key)
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
        self.client = backend._client()
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
                            self._put(self.b.body(view, want))
                        view = view[want:]
                        continue
                    # sized to what this part will hold: sent whole, no second copy
                    self.buf = self.b.take_buffer(want)
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
            except BaseException as exc:  # noqa: BLE001 - raised where a pool's would be
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
            body = self.b.body(buf, n)
            with self.b.calls(f"upload part {number} of {self.name}"):
                resp = self.client.upload_part(Bucket=self.b.bucket, Key=self.key,
                                               UploadId=self.upload_id, PartNumber=number, Body=body)
            part = {"PartNumber": number, "ETag": resp["ETag"]}
            if resp.get("ChecksumCRC32"):
                part["ChecksumCRC32"] = resp["ChecksumCRC32"]
            return part
        finally:
            if pooled:
                self.b.give_buffer(cast(bytearray, buf))

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
            self._put(b"" if self.buf is None else b.body(self.buf, self.fill))
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

    def _free(self) -> None:
        if self.buf is not None:
            self.b.give_buffer(self.buf)
            self.buf = None
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None

    def close(self) -> None:
        self._free()

    def abort(self) -> None:
        for fut in self.pending:
            fut.cancel()
        self._free()
        self.pending.clear()
        if self.upload_id and not self.done:
            with contextlib.suppress(Exception):  # best effort; remove_tree retries it
                self.b._client("quick").abort_multipart_upload(
                    Bucket=self.b.bucket, Key=self.key, UploadId=self.upload_id)
            self.done = True


class _ViewBody:
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

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: len(self.view)}[whence]
        self.pos = min(max(0, base + pos), len(self.view))
        return self.pos

    def tell(self) -> int:
        return self.pos


class _S3Reader(ReadHandle):
    def __init__(self, backend: S3Backend, key: str) -> None:
        self.b = backend
        self.name = key
        self.key = backend._key(key)
        self.client = backend._client()
        self.pool: ThreadPoolExecutor | None = None

    def readinto(self, offset: int, buf: memoryview) -> int:
        view = memoryview(buf).cast("B") if memoryview(buf).format != "B" else memoryview(buf)
        n = len(view)
        if n == 0:
            return 0
        k = max(1, min(self.b.concurrency, n // MIN_RANGE))
        if k == 1:
            return self._range(offset, view)
        step = -(-n // k)
        pieces = [(offset + s, view[s:s + step]) for s in range(0, n, step)]
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.b.concurrency, thread_name_prefix="ckptbench-s3")
        futures = [self.pool.submit(self._range, off, piece) for off, piece in pieces[1:]]
        got = [self._range(*pieces[0])]
        got += [f.result() for f in futures]
        total = 0
        for (_, piece), g in zip(pieces, got, strict=True):
            total += g
            if g < len(piece):  # the object ended inside this piece
                break
        return total

    def _range(self, offset: int, view: memoryview) -> int:
        """One ranged GET into `view`; body errors (after the headers) are retried here,
        since botocore's retries end when the response headers arrive."""
        from botocore.exceptions import ClientError

        b = self.b
        end = offset + len(view) - 1
        attempt = 1
        while True:
            with b.calls(f"read {self.name}"):
                try:
                    resp = self.client.get_object(Bucket=b.bucket, Key=self.key,
                                                  Range=f"bytes={offset}-{end}")
                except ClientError as exc:
                    code = exc.response.get("Error", {}).get("Code")
                    if code == "InvalidRange":
                        return 0  # offset at or past the end of the object
                    if code in ("NoSuchKey", "404"):
                        raise BackendError(f"{b.target}: read {self.name}: no such object") from None
                    raise
            length = int(resp.get("ContentLength", 0))
            if length > len(view):
                resp["Body"].close()
                raise BackendError(f"{b.target}: read {self.name}: the endpoint ignored the byte "
                                   "range (sent more than asked); allowed: an S3 API with ranged GET")
            try:
                return _read_body(resp["Body"], view[:length])
            except Exception as exc:  # noqa: BLE001 - a dropped body: retry like botocore
                if not _is_connection_error(exc) or attempt >= b.max_attempts:
                    if _is_connection_error(exc):
                        b._proc().dead = True
                    raise b.error(exc, f"read {self.name}") from None
                b._proc().count("retries")
                b._proc().count("retries_connection")
                b.backoff(attempt)
                attempt += 1

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
