"""DCP's own S3 storage layer, as PyTorch users run it: s3torchconnector's
``S3StorageWriter`` and ``S3StorageReader`` (the torch-dcp format with
``--s3-transport s3torchconnector``).

Their client is Mountpoint's S3 client (the AWS Common Runtime, native threads), with
s3torchconnector's defaults (the reader fetches the ranges DCP's load plan names,
coalesced; the writer streams each ``.distcp`` file as a multipart upload), pointed at the
run's endpoint, addressing style and ``--s3-max-attempts``. Credentials come from that
client's default chain (environment, shared files, instance roles: the sources boto3's
chain reads); retries are its own and not counted (the records say ``retries_counted:
false``). Imported only when chosen.
"""

from __future__ import annotations

import importlib
from typing import Any

from ckptbench.backends import Backend
from ckptbench.backends.s3 import S3Backend
from ckptbench.errors import BackendError


def _s3torchconnector() -> Any:
    try:
        return importlib.import_module("s3torchconnector")
    except ImportError:
        raise BackendError("--s3-transport s3torchconnector needs the s3torchconnector package "
                           "(and torch); allowed: pip install s3torchconnector, or "
                           "--s3-transport botocore") from None


def s3torch_storage(backend: Backend, url: str, writer: bool, threads: int) -> Any:
    """DCP's storage writer (`writer`) or reader for the checkpoint at `url` (s3://...)."""
    if not isinstance(backend, S3Backend):
        raise BackendError(f"target {backend.target}: --s3-transport s3torchconnector needs an "
                           "s3:// target")
    tc = _s3torchconnector()
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter

    resolved = backend.clients.resolve()
    config = tc.S3ClientConfig(force_path_style=resolved.addressing_style == "path",
                               max_attempts=backend.options.max_attempts)
    region, endpoint = resolved.region, resolved.endpoint
    if writer:
        storage = S3StorageWriter(region, url, s3client_config=config, thread_count=threads)
        constructor = None
    else:
        storage = S3StorageReader(region, url, s3client_config=config)
        constructor = storage._reader_constructor
    # the run's endpoint (the storage classes take none): their file system over a client
    # made for it, with the same configuration and reader
    client = S3Client(region, endpoint=endpoint, s3client_config=config)
    storage.fs = S3FileSystem(region, s3_client=client, reader_constructor=constructor)
    return storage
