"""CLI options that configure backends, and the dict each backend receives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ckptbench.backends import scheme_of


def backend_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a command with the backend options (kept here so backends own their flags)."""
    options = [
        click.option("--io", "io_mode", type=click.Choice(["buffered", "direct"]), default="buffered",
                     show_default=True,
                     help="Files: buffered + fsync (what frameworks do) or O_DIRECT (device ceiling)."),
        click.option("--endpoint-url", default=None,
                     help="S3 endpoint, e.g. http://127.0.0.1:9000 (else boto3's configuration: "
                          "AWS_ENDPOINT_URL_S3). Credentials: boto3's standard chain only."),
        click.option("--part-size", default="8MiB", show_default=True,
                     help="S3 multipart part size (5MiB-5GiB); objects up to one part are one PUT."),
        click.option("--s3-concurrency", type=click.IntRange(min=1), default=8, show_default=True,
                     help="S3 parts in flight per object, and parallel ranged GETs per read."),
        click.option("--s3-checksum", type=click.Choice(["when_required", "when_supported"]),
                     default="when_required", show_default=True,
                     help="S3 request checksums (and response validation); when_supported: CRC32."),
        click.option("--s3-payload-signing", type=click.Choice(["auto", "on", "off"]),
                     default="auto", show_default=True,
                     help="SHA-256 of each S3 body in the signature (auto: botocore's choice, on "
                          "over http)."),
        click.option("--s3-max-attempts", type=click.IntRange(min=1), default=3, show_default=True,
                     help="S3 attempts per request (botocore standard retry mode)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_backend_options(target: str, threads: int, cli: dict[str, Any]) -> dict[str, Any]:
    """The options dict for the backend of `target`, from the parsed CLI values."""
    from ckptbench.units import parse_size

    scheme = scheme_of(target)
    if scheme == "file":
        return {"io": cli["io_mode"]}
    part_size = parse_size(cli["part_size"], "--part-size")
    if scheme == "s3":
        return {"endpoint_url": cli["endpoint_url"], "part_size": part_size,
                "concurrency": cli["s3_concurrency"], "io_threads": threads,
                "checksum": cli["s3_checksum"], "payload_signing": cli["s3_payload_signing"],
                "max_attempts": cli["s3_max_attempts"]}
    # Any other fsspec URL: the endpoint (for s3-like file systems) and the block size.
    return {"endpoint_url": cli["endpoint_url"], "block_size": part_size}
