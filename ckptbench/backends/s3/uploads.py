"""Unfinished multipart uploads, listed for cleanup (a killed or stalled writer's): by
key for the names a run recorded, or under a prefix for ``remove_tree``. Every request
goes through the backend's cleanup client, bounded as it is (client.CLEANUP_BUDGET_S).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptbench.backends.s3.backend import S3Backend

UPLOAD_PAGES = 10  # of 1,000 unfinished uploads each, listed when cleaning up


def uploads_of(b: S3Backend, keys: Sequence[str]) -> list[tuple[str, str]]:
    """(key, upload id) of every unfinished upload of `keys`. Listed key by key: MinIO
    lists the uploads of one exact key for a prefix, so a prefix listing would miss
    them; a few requests in parallel, and the first that fails ends the listing (the
    keys not listed yet are not waited for)."""
    def one(key: str) -> list[tuple[str, str]]:
        full = b.object_key(key)
        with b.calls(f"list the uploads of {key}"):
            resp = b.cleanup_client().list_multipart_uploads(Bucket=b.bucket, Prefix=full)
        return [(u["Key"], u["UploadId"]) for u in resp.get("Uploads", []) if u["Key"] == full]

    if not keys:
        return []
    pool = ThreadPoolExecutor(max(1, min(b.concurrency, 16, len(keys))))
    try:
        return [u for found in pool.map(one, keys) for u in found]
    finally:
        pool.shutdown(cancel_futures=True)


def uploads_under(b: S3Backend, client: Any, base: str) -> list[tuple[str, str]]:
    """(key, upload id) of the unfinished multipart uploads under `base`. MinIO takes a
    prefix for this listing as an exact object name, so when the prefixed listing is
    empty the bucket's own is filtered instead (at most UPLOAD_PAGES pages)."""
    found = _list(b, client, base)
    if not found:
        found = [u for u in _list(b, client, "") if u[0].startswith(base)]
    return found


def _list(b: S3Backend, client: Any, prefix: str) -> list[tuple[str, str]]:
    args = {"Bucket": b.bucket, **({"Prefix": prefix} if prefix else {})}
    pages = client.get_paginator("list_multipart_uploads").paginate(**args)
    out: list[tuple[str, str]] = []
    for n, page in enumerate(pages):
        out += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        if n + 1 >= UPLOAD_PAGES:
            break
    return out
