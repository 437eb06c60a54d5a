"""The S3 backend's options, S3's size limits, and target URLs (s3://bucket/prefix)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ckptbench.backends.options import BackendOptions, option
from ckptbench.errors import BackendError
from ckptbench.redact import public_url

MIB = 1 << 20
MIN_PART = 5 * MIB  # S3: every part but the last is at least 5 MiB ...
MAX_PART = 5 << 30  # ... and at most 5 GiB,
MAX_PARTS = 10_000  # and an upload has at most 10,000 parts.
MIN_RANGE = 4 * MIB  # a read buffer is split into parallel ranged GETs of at least this size
CHECKSUM_MODES = ("when_required", "when_supported")
PAYLOAD_SIGNING = ("auto", "on", "off")
TRANSPORTS = ("botocore", "crt", "obstore", "s3torchconnector")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")


@dataclass(frozen=True)
class S3Options(BackendOptions):
    endpoint_url: str | None = field(default=None, metadata=option(
        "--endpoint-url", "S3 endpoint, e.g. http://127.0.0.1:9000 (else boto3's configuration: "
        "AWS_ENDPOINT_URL_S3). Credentials: boto3's standard chain only."))
    part_size: int | None = field(default=None, metadata=option(
        "--part-size", "S3 multipart part size (5MiB-5GiB); objects up to one part are one PUT "
        "(default: chosen per object, docs/s3.md).", size=True))
    concurrency: int | None = field(default=None, metadata=option(  # None: sizing.Sizing
        "--s3-concurrency", "S3 parts in flight per object, and parallel ranged GETs per read "
        "(default: chosen from the ranks per host and threads).", minimum=1))
    transport: str = field(default="botocore", metadata=option(
        "--s3-transport", "S3 data path: botocore (Python threads), crt (AWS Common Runtime), "
        "obstore (Rust object_store); s3torchconnector: with --format torch-dcp, DCP's "
        "S3StorageWriter/Reader from s3torchconnector.", choices=TRANSPORTS))
    checksum: str = field(default="when_required", metadata=option(
        "--s3-checksum", "S3 request checksums (and response validation); when_supported: CRC32.",
        choices=CHECKSUM_MODES))
    payload_signing: str = field(default="auto", metadata=option(
        "--s3-payload-signing", "SHA-256 of each S3 body in the signature (auto: botocore's "
        "choice, on over http).", choices=PAYLOAD_SIGNING))
    # botocore standard mode: 1 try + 5 retries, each after a jittered exponential backoff
    # (up to 1, 2, 4, 8, 16 s): a loaded endpoint that closes connections or says SlowDown
    # gets time to recover instead of failing the run (3 attempts failed 8-rank runs on a
    # loaded 2-core MinIO; benchmarks/results/2026-12-s3-under-load.md)
    max_attempts: int = field(default=6, metadata=option(
        "--s3-max-attempts", "S3 attempts per request (botocore standard retry mode: "
        "jittered exponential backoff between them).", minimum=1))
    create_bucket: bool = field(default=False, metadata=option(
        "--create-bucket", "Make the target's bucket when it does not exist (it is kept "
        "afterwards; without this flag a missing bucket is an error).", switch=True))
    connect_timeout: float = 5.0
    read_timeout: float = 60.0

    def validate(self) -> None:
        if self.part_size is not None and not MIN_PART <= self.part_size <= MAX_PART:
            raise BackendError(f"--part-size {self.part_size}: S3 parts must be 5 MiB to 5 GiB; "
                               "allowed: e.g. 8MiB, 64MiB")
        endpoint = self.endpoint_url
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise BackendError(f"--endpoint-url {public_url(endpoint)!r}: allowed: an "
                               "http:// or https:// URL")


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
