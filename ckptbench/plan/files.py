"""Grouping chunks into files or objects.

``dcp``: DCP's FileSystemWriter, ``__{rank}_{k}.distcp`` for k < threads per rank. With
one thread a rank's file holds its items in plan order; with more, items are sorted by
size (largest first) and each goes to the bucket with the fewest bytes so far, as DCP's
``_split_by_size_and_type`` does. Every bucket becomes a file, even an empty one.
``per-chunk``: one file (object) per chunk, named ``<key>/<offsets joined by '.'>``.
"""

from __future__ import annotations

import numpy as np


def dcp_buckets(nbytes: np.ndarray, threads: int) -> np.ndarray:
    """Bucket (file index within the rank) of each of one rank's items, in plan order."""
    if threads == 1 or len(nbytes) == 0:
        return np.zeros(len(nbytes), dtype=np.int64)
    order = np.argsort(-nbytes, kind="stable")
    bucket_sizes = [0] * threads
    out = np.empty(len(nbytes), dtype=np.int64)
    for i in order.tolist():
        b = min(range(threads), key=bucket_sizes.__getitem__)
        out[i] = b
        bucket_sizes[b] += int(nbytes[i])
    return out


def dcp_file_name(rank: int, k: int) -> str:
    return f"__{rank}_{k}.distcp"


def chunk_file_name(key: str, offsets: np.ndarray) -> str:
    return f"{key}/{'.'.join(str(int(o)) for o in offsets) or '0'}"
