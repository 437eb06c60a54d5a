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
        click.option("--endpoint-url", default=None, help="S3 endpoint (else boto3's configuration)."),
        click.option("--part-size", default="8MiB", show_default=True, help="S3 multipart part size."),
        click.option("--s3-checksum", type=click.Choice(["when_required", "when_supported"]),
                     default="when_required", show_default=True, help="S3 request checksums."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_backend_options(target: str, threads: int, cli: dict[str, Any]) -> dict[str, Any]:
    """The options dict for the backend of `target`, from the parsed CLI values."""
    from ckptbench.cli.run_cmd import parse_size

    scheme = scheme_of(target)
    if scheme == "file":
        return {"io": cli["io_mode"]}
    if scheme == "s3":
        return {"endpoint_url": cli["endpoint_url"],
                "part_size": parse_size(cli["part_size"], "--part-size"),
                "checksum": cli["s3_checksum"], "concurrency": threads}
    return {}
