"""S3 and S3-compatible object stores (AWS S3, MinIO, Ceph RGW, ...) through boto3: the
backend that ties the package's modules (ckptbench.backends.s3) to a ``s3://bucket/prefix``
target. The endpoint comes from ``--endpoint-url`` or boto3's standard configuration
(``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the config file); credentials come only
from boto3's standard chain and are never stored, recorded or printed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from ckptbench.backends.base import (
    NOT_LISTED,
    TARGET_MARKER,
    UPLOAD_NOT_ABORTED,
    Backend,
    NameTaken,
    ReadHandle,
    RequestWatch,
    WriteHandle,
    marker_bytes,
)
from ckptbench.backends.options import IOHints
from ckptbench.backends.s3.boto_readahead import boto_readahead
from ckptbench.backends.s3.client import (
    CLEANUP_BUDGET_S,
    ProcessState,
    S3Clients,
    request_watch,
    watch_requests,
    watched,
)
from ckptbench.backends.s3.errors import (
    is_boto_error,
    is_connection_error,
    public_endpoint,
    translate,
)
from ckptbench.backends.s3.options import S3Options, parse_target
from ckptbench.backends.s3.sizing import PART_RANGE, Sizing, ranks_per_host
from ckptbench.backends.s3.transport import (
    DCP_STORAGE,
    MODULES,
    transfer_details,
    transport_for,
)
from ckptbench.backends.s3.uploads import uploads_of, uploads_under
from ckptbench.backends.s3.writer import S3Writer
from ckptbench.errors import BackendError


class S3Backend(Backend):
    name = "s3"
    Options: ClassVar[type[S3Options]] = S3Options
    options: S3Options

    def __init__(self, target: str, options: S3Options | None = None,
                 hints: IOHints | None = None) -> None:
        super().__init__(target, options, hints)
        self.bucket, self.prefix = parse_target(target)
        o = self.options
        self.sizing = Sizing(o.part_size, o.concurrency, self.hints.threads,
                             ranks_per_host(self.hints.ranks_per_host))
        self.part_size = self.sizing.base_part  # part buffers are pooled at this size
        self.concurrency = self.sizing.in_flight
        self.checksum = o.checksum
        self.payload_signing = o.payload_signing
        # Bodies are sent from the caller's memory rather than copied into bytes (see
        # writer.ViewBody); botocore's CRC32 request checksums want bytes, so --s3-checksum
        # when_supported copies.
        self.zero_copy = self.checksum == "when_required"
        self.max_attempts = o.max_attempts
        self.clients = S3Clients(o, self.hints.threads, self.concurrency)
        self.created_marker = False
        self.unaborted: set[str] = set()  # keys whose uploads no abort was confirmed for
        self.undeleted: set[str] = set()  # keys whose delete was not confirmed

    # --- keys and processes ---
    def _key(self, key: str) -> str:
        key = key.strip("/")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _proc(self) -> ProcessState:
        return self.clients.proc()

    def _client(self, kind: str = "main") -> Any:
        """This process's client: 'main' or 'quick' (see S3Clients); the cleanup's once
        the run ended here (cleaning_up)."""
        if kind == "main" and self._proc().cleaning:
            return self._cleanup_client()
        return self.clients.client(kind)

    def _control(self) -> tuple[Any, str]:
        """The client for the target's control requests (marker, listings, manifest,
        intent, lease) and its kind. In a rank, 'main': its stall watch bounds each one
        (no answer for --stall-timeout is a stall); in a process that prepared a run and
        has no watch (the launcher's parent), 'control': a store that stops answering
        fails the request in about 20 s, where 'main' kept the run waiting six tries of
        60 s; once the run ended here, the cleanup's."""
        proc = self._proc()
        if proc.cleaning:
            return self._cleanup_client(), "last" if proc.dead else "quick"
        kind = "control" if proc.prepared and request_watch() is None else "main"
        return self.clients.client(kind), kind

    def watch_requests(self, watch: RequestWatch) -> None:
        watch_requests(watch, os.getpid())

    def cleaning_up(self, unresponsive: bool) -> None:
        proc = self._proc()
        proc.cleaning = True
        if unresponsive:
            proc.stopped_answering()

    # the session its handles hold (s3.session.S3Session): these, and its public fields
    object_key = _key
    process = _proc
    client = _client

    # --- errors ---
    def error(self, exc: BaseException, action: str, kind: str = "main") -> BackendError:
        """One line for the usual ways S3 says no (never a key, never a traceback);
        `kind`: the client that made the request (its read timeout is named)."""
        resolved = self.clients.resolved
        endpoint = public_endpoint(resolved.endpoint if resolved else self.options.endpoint_url)
        return translate(exc, f"{self.target}: {action}", endpoint or "the default S3 endpoint",
                         self.bucket, action, self.clients.read_timeout(kind), self.limits())

    def limits(self) -> str:
        """The options that size the load, named where the endpoint gave up under it."""
        return (f"a lower --s3-concurrency (now {self.concurrency}) or a larger "
                f"--s3-max-attempts (now {self.max_attempts})")

    @contextlib.contextmanager
    def calls(self, action: str, kind: str = "main") -> Any:
        """Map botocore's exceptions raised inside to one-line BackendErrors (`kind`: the
        client's, for the timeout a message names). Outside a save or restore, this
        process's stall watch (a rank's) is armed meanwhile: a store that never answers is
        a stall at --stall-timeout (client.watch_requests)."""
        try:
            with watched(action):
                yield
        except BackendError:
            raise
        except Exception as exc:
            if not (is_boto_error(exc) or is_connection_error(exc)):
                raise
            if is_connection_error(exc):
                self._proc().stopped_answering()
            raise self.error(exc, action, kind) from None
        if self._proc().dead:
            self._proc().answered()

    # --- the target ---
    @property
    def marker_key(self) -> str:
        return self._key(TARGET_MARKER)

    def prepare(self) -> None:
        self._proc().prepared = True  # this process's control requests: bounded (_control)
        if self.options.create_bucket:
            self._make_bucket()
        base = f"{self.prefix}/" if self.prefix else ""
        with self.calls("check the target", "quick"):  # an unreachable endpoint fails in seconds
            listing = self._client("quick").list_objects_v2(Bucket=self.bucket, Prefix=base,
                                                            MaxKeys=3)
        client, kind = self._control()
        others = [o["Key"] for o in listing.get("Contents", []) if o["Key"] != self.marker_key]
        if self._head(self.marker_key, "check the target"):
            return
        if others:
            raise BackendError(
                f"target {self.target} holds objects not made by ckptbench (e.g. {others[0]!r}); "
                "allowed: a new or empty prefix, or one ckptbench marked before")
        with self.calls("mark the target", kind):
            client.put_object(Bucket=self.bucket, Key=self.marker_key, Body=marker_bytes())
        self.created_marker = True

    def _make_bucket(self) -> None:
        """--create-bucket: the bucket, made when missing and kept (a bucket is the user's
        to keep or delete; a run's own objects and marker are removed as always)."""
        from botocore.exceptions import ClientError

        with self.calls("check the bucket", "quick"):
            try:
                self._client("quick").head_bucket(Bucket=self.bucket)
                return
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket",
                                                                     "NotFound"):
                    raise
        client, kind = self._control()
        region = self.clients.resolved.region if self.clients.resolved else "us-east-1"
        where = {} if region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": region}}
        with self.calls("make the bucket", kind):
            client.create_bucket(Bucket=self.bucket, **where)

    def release(self) -> None:
        if not self.created_marker:
            return
        base = f"{self.prefix}/" if self.prefix else ""
        try:
            with self.calls("release the target"):
                client = self._cleanup_client()
                listing = client.list_objects_v2(Bucket=self.bucket, Prefix=base, MaxKeys=3)
                if any(o["Key"] != self.marker_key for o in listing.get("Contents", [])):
                    return
                client.delete_object(Bucket=self.bucket, Key=self.marker_key)
                self.created_marker = False
        except BackendError:
            self._proc().count("cleanup_errors")

    def _cleanup_client(self) -> Any:
        """Cleanup (deletes, aborts) is bounded: short timeouts, one try once the endpoint
        has stopped answering and no call after CLEANUP_BUDGET_S, so a frozen or dead
        server cannot hold a run's exit."""
        kind = self._proc().cleanup_kind()
        if kind is None:
            raise BackendError(f"{self.target}: not tried: the endpoint has not answered the "
                               f"cleanup for {CLEANUP_BUDGET_S:g} s (its budget)")
        return self.clients.client(kind)

    cleanup_client = _cleanup_client

    def _head(self, key: str, action: str) -> bool:
        from botocore.exceptions import ClientError

        client, kind = self._control()
        with self.calls(action, kind):
            try:
                client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise
        return True

    def for_parent(self) -> S3Backend:
        """A view on botocore: obstore's runtime (tokio) does not survive a fork, so a
        parent that used it could fork no rank that restores through it."""
        if self.options.transport not in MODULES:
            return self
        view = copy.copy(self)
        view.options = dataclasses.replace(self.options, transport="botocore")
        return view

    # --- data ---
    def open_write(self, key: str, size: int) -> WriteHandle:
        if self.options.transport in MODULES:
            return transport_for(self).open_write(key, size)
        return S3Writer(self, key, size)

    def open_read(self, key: str) -> ReadHandle:
        if self.options.transport in MODULES:
            return transport_for(self).open_read(key)
        return boto_readahead(self).open_read(key)

    def open_read_planned(self, key: str, spans: Sequence[tuple[int, int]]) -> ReadHandle:
        """The planned spans' GETs kept in flight, `concurrency` at a time (readahead)."""
        if self.options.transport in MODULES:
            return transport_for(self).open_read(key, spans)
        return boto_readahead(self).open_read(key, spans)

    def check_run(self, shared_file: bool, restore: bool, processes: int,
                  own_storage: bool = False) -> None:
        super().check_run(shared_file, restore, processes, own_storage)
        if self.options.transport == DCP_STORAGE and not own_storage:
            raise BackendError(f"--s3-transport {DCP_STORAGE}: DCP's own S3 storage writer and "
                               "reader, so only with --format torch-dcp; allowed: --format "
                               "torch-dcp, or --s3-transport botocore, crt or obstore")

    def buffer_bytes(self) -> int:
        ranges = PART_RANGE[0] if self.options.transport in MODULES else PART_RANGE[1]
        return self.sizing.buffer_bytes(ranges)

    def warm_reads(self) -> None:
        """The botocore read-ahead's staging buffers, made and touched now (crt and
        obstore allocate per GET, in native code)."""
        if self.options.transport not in MODULES:
            boto_readahead(self).warm()

    def put_atomic(self, key: str, data: bytes | memoryview) -> None:
        # One PUT: readers see the whole object or none of it.
        client, kind = self._control()
        with self.calls(f"put {key}", kind):
            client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        client, kind = self._control()
        with self.calls(f"get {key}", kind):
            try:
                resp = client.get_object(Bucket=self.bucket, Key=self._key(key))
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
        try:
            with self.calls(f"remove {prefix}"):
                client = self._cleanup_client()
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
                for key, upload_id in uploads_under(self, client, base):
                    client.abort_multipart_upload(Bucket=self.bucket, Key=key,
                                                  UploadId=upload_id)
        except BackendError:
            self._proc().count("cleanup_errors")

    # --- what a run made, by name ---
    def create_dir(self, key: str) -> None:
        client, kind = self._control()
        with self.calls(f"check {key}", kind):
            listing = client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._key(key) + "/", MaxKeys=1)
        if listing.get("Contents"):
            raise NameTaken(f"{self.target}/{key}: already exists; ckptbench never reuses a "
                            "key prefix")

    def delete(self, keys: Sequence[str]) -> None:
        """DeleteObjects by name, 1,000 keys a request; failures counted (cleanup_errors)."""
        names = [self._key(k) for k in keys]
        self.undeleted.update(keys)
        try:
            with self.calls("remove the run's objects"):
                for i in range(0, len(names), 1000):
                    failed = self._delete(self._cleanup_client(),
                                          [{"Key": k} for k in names[i:i + 1000]])
                    self.undeleted.difference_update(
                        k for k in keys[i:i + 1000] if self._key(k) not in failed)
        except BackendError:
            self._proc().count("cleanup_errors")

    def pending_uploads(self, keys: Sequence[str]) -> int | None:
        """How many uploads `keys` have. A store that cannot say confirms no abort: each
        key is named in left_behind, as after a failed abort (what --clean-debris checks)."""
        try:
            found = uploads_of(self, keys)
        except BackendError:
            self._proc().count("cleanup_errors")
            self.unaborted.update(keys)
            return None  # cannot say: the caller keeps the run's intent
        if not found:
            self.unaborted.difference_update(keys)
        return len(found)

    def abort_uploads(self, keys: Sequence[str]) -> int:
        """Abort the unfinished uploads of `keys`; those it could not list or abort are
        remembered for the cleanup record (left_behind), never silently dropped."""
        aborted = 0
        self.unaborted.update(keys)
        try:
            for key, upload_id in uploads_of(self, keys):
                with self.calls(f"abort the upload of {key}"):
                    self._cleanup_client().abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                aborted += 1
        except BackendError:
            self._proc().count("cleanup_errors")
            return aborted
        self.unaborted.difference_update(keys)
        return aborted

    def left_behind(self, prefix: str, limit: int) -> list[str]:
        """The objects under `prefix`, and the uploads no abort could be confirmed for; a
        listing that fails is named, not taken for an empty prefix, and so is each object
        of the run's whose delete was not confirmed then (a store gone mid-cleanup: the
        run's own objects by name, not one anonymous line; a key whose upload may be
        unfinished too is named once, as that)."""
        under = prefix.rstrip("/") + "/"
        left = [f"{k}{UPLOAD_NOT_ABORTED}" for k in sorted(self.unaborted)
                if k.startswith(under)]
        try:
            listed = self._names_under(prefix, limit)
        except BackendError as exc:
            gone = [f"{k}{NOT_LISTED}its delete was not confirmed)"
                    for k in sorted(self.undeleted - self.unaborted) if k.startswith(under)]
            return [*gone, *left, f"{prefix}/{NOT_LISTED}{exc})"][:limit]
        return [*listed, *left][:limit]

    def list_names(self, prefix: str, limit: int) -> list[str]:
        try:
            return self._names_under(prefix, limit)
        except BackendError:
            return []

    def _names_under(self, prefix: str, limit: int) -> list[str]:
        base = self._key(prefix).rstrip("/")
        base = base + "/" if base else ""  # "": the whole target (a bucket without prefix)
        strip = len(self.prefix) + 1 if self.prefix else 0
        with self.calls(f"list {prefix}"):
            listing = self._cleanup_client().list_objects_v2(Bucket=self.bucket, Prefix=base,
                                                             MaxKeys=limit)
        return [o["Key"][strip:] for o in listing.get("Contents", [])]

    def run_dirs(self) -> list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        out: list[str] = []
        client, kind = self._control()
        with self.calls("list the target", kind):
            pages = client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base, Delimiter="/")
            for page in pages:
                out += [p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(out)

    def _delete(self, client: Any, batch: list[dict[str, str]]) -> set[str]:
        """One DeleteObjects; the keys it could not delete."""
        resp = client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
        errors = resp.get("Errors") or []
        if errors:
            self._proc().count("cleanup_errors", len(errors))
        return {str(e.get("Key")) for e in errors}

    def drop_cache(self, keys: list[str]) -> str:
        return "none (object store)"

    def stats(self) -> dict[str, int]:
        return self._proc().take_stats()

    @property
    def endpoint_url(self) -> str | None:
        return self.options.endpoint_url

    def details(self) -> dict[str, Any]:
        import boto3
        import botocore

        r = self.clients.resolve()
        auth = None
        with contextlib.suppress(Exception):
            creds = self.clients.session().get_credentials()
            auth = creds.method if creds is not None else None
        return {
            "endpoint": public_endpoint(r.endpoint),
            "bucket": self.bucket,
            "prefix": self.prefix,
            "region": r.region,
            "addressing_style": r.addressing_style,
            **self.sizing.describe(),
            "checksum": {"request": self.checksum, "response": self.checksum},
            "payload_signing": self.payload_signing,
            "retries": {"mode": "standard", "max_attempts": self.max_attempts},
            "transfer": transfer_details(self),
            "auth": auth,  # where boto3 found the credentials ('env', ...), never the keys
            "boto3": boto3.__version__,
            "botocore": botocore.__version__,
        }

    def part_size_for(self, size: int) -> int:
        """The part size of an object of `size` bytes (sizing.Sizing.part_for)."""
        return self.sizing.part_for(size)
