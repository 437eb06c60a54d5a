"""Grouping chunks into files or objects, and where each rank's bytes sit in them.

``dcp``: DCP's FileSystemWriter, ``__{rank}_{k}.distcp`` for k < threads per rank. With
one thread a rank's file holds its items in plan order; with more, items are sorted by
size (largest first) and each goes to the bucket with the fewest bytes so far, as DCP's
``_split_by_size_and_type`` does. Every bucket becomes a file, even an empty one.
``per-chunk``: one file (object) per chunk, named ``<key>/<offsets joined by '.'>``.
``per-rank`` (N-N, as IOR and DLIO name it): one file ``rank_{r}.bin`` per rank whatever
the thread count, items in plan order.
``shared`` (N-1): one file ``checkpoint.bin`` for all ranks; rank r's items, in plan
order, fill a region that starts at a multiple of the stripe size (see
:func:`region_layout`), so no two ranks write the same stripe.

A plan lists, per rank, "files" it writes. With ``shared`` every rank has one entry and
all the entries name the same path: an entry is then a region of that path, at the
offset :func:`region_layout` gives. The layout is derived from the plan (paths, bytes,
stripe size), so the plan itself stays one array per concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ckptbench.plan.core import Plan

SHARED_FILE_NAME = "checkpoint.bin"


def dcp_buckets(weights: np.ndarray, threads: int) -> np.ndarray:
    """Bucket (file index within the rank) of each of one rank's items, in plan order.

    `weights` are the items' global tensor bytes: DCP sorts and balances by those."""
    if threads == 1 or len(weights) == 0:
        return np.zeros(len(weights), dtype=np.int64)
    order = np.argsort(-weights, kind="stable")
    bucket_sizes = [0] * threads
    out = np.empty(len(weights), dtype=np.int64)
    for i in order.tolist():
        b = min(range(threads), key=bucket_sizes.__getitem__)
        out[i] = b
        bucket_sizes[b] += int(weights[i])
    return out


def dcp_file_name(rank: int, k: int) -> str:
    return f"__{rank}_{k}.distcp"


def per_rank_file_name(rank: int) -> str:
    return f"rank_{rank}.bin"


def chunk_file_name(key: str, offsets: np.ndarray) -> str:
    return f"{key}/{'.'.join(str(int(o)) for o in offsets) or '0'}"


@dataclass(frozen=True)
class RegionLayout:
    """Where each plan file entry's bytes start in its path, and the shared paths' sizes."""

    base: np.ndarray  # int64 [files]: byte offset of the entry in its path (0 if unshared)
    shared_size: dict[str, int]  # path -> size of the whole file, for paths several ranks write

    def is_shared(self, path: str) -> bool:
        return path in self.shared_size


def region_layout(file_paths: tuple[str, ...] | list[str], file_bytes: np.ndarray,
                  file_rank: np.ndarray, align: int) -> RegionLayout:
    """Regions of paths that several entries share: back to back in entry order (rank
    order), each starting at a multiple of `align` (IOR's N-1 segments, stripe-aligned).

    An entry that has its path to itself starts at 0. Each rank has at most one region
    in a shared path (the manifest names a region by path and rank).
    """
    n = len(file_paths)
    base = np.zeros(n, dtype=np.int64)
    groups: dict[str, list[int]] = {}
    for f, path in enumerate(file_paths):
        groups.setdefault(path, []).append(f)
    shared: dict[str, int] = {}
    for path, entries in groups.items():
        if len(entries) == 1:
            continue
        ranks = [int(file_rank[f]) for f in entries]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"{path}: a rank has more than one region in a shared file")
        offset = end = 0
        for f in entries:
            base[f] = offset
            n = int(file_bytes[f])
            if n:
                end = offset + n
                offset = -(-end // align) * align
        shared[path] = end  # the end of the last byte written (empty regions add nothing)
    base.flags.writeable = False
    return RegionLayout(base, shared)


def plan_layout(plan: Plan) -> RegionLayout:
    """The region layout of a plan: stripe-aligned regions for ``files = "shared"``."""
    ckpt = plan.workload.checkpoint
    if ckpt.files != "shared":
        base = np.zeros(plan.n_files, dtype=np.int64)
        base.flags.writeable = False
        return RegionLayout(base, {})
    return region_layout(plan.file_paths, plan.file_bytes, plan.file_rank, ckpt.stripe_size)
