"""DCP's rule for chunks that several ranks hold: one writer, the least loaded so far.

This follows torch.distributed.checkpoint's ``dedup_save_plans``: walk every write item
in the order the ranks' plans list them (rank 0's items, then items first seen on rank 1,
...), add each item's weight -- its *global* tensor bytes, 1 for a non-tensor
item -- to the plan that keeps it, and give a replicated
item to the holder whose plan is smallest at that moment; ties go to the first holder
in Python set order, as ``min`` over the set does in torch.

Only replicated items need a decision. When one is reached in rank q's block, holders
after q have received only replicated items so far, while q's own plan also holds its
unique items seen before this one; a running sum per rank and a prefix sum of unique
sizes per block give every plan's size exactly, without walking unique items one by one.
"""

from __future__ import annotations

import numpy as np


def assign_writers(
    first_holder: np.ndarray,
    holder_ptr: np.ndarray,
    holders: np.ndarray,
    weight: np.ndarray,
    world_size: int,
) -> np.ndarray:
    """Writer rank of each item; items must be in stream order (block, then plan order).

    `weight` is what DCP adds to a plan per item: the global tensor bytes (1 for
    non-tensor items)."""
    writer = first_holder.astype(np.int32).copy()
    counts = np.diff(holder_ptr)
    replicated = np.flatnonzero(counts > 1)
    if len(replicated) == 0:
        return writer
    size = np.maximum(weight, 1).astype(np.int64)
    unique_size = np.where(counts == 1, size, 0)
    before = np.cumsum(unique_size) - unique_size  # unique bytes earlier in the stream
    block_start = np.searchsorted(first_holder, first_holder, side="left")
    prefix = (before - before[block_start])[replicated].tolist()

    planned = [0] * world_size
    sizes = size[replicated].tolist()
    firsts = first_holder[replicated].tolist()
    starts = holder_ptr[replicated].tolist()
    ends = holder_ptr[replicated + 1].tolist()
    chosen = np.empty(len(replicated), dtype=np.int32)
    for j in range(len(replicated)):
        q, own = firsts[j], prefix[j]
        candidates = set(holders[starts[j]:ends[j]].tolist())
        best = min(candidates, key=lambda p: planned[p] + own if p == q else planned[p])
        planned[best] += sizes[j]
        chosen[j] = best
    writer[replicated] = chosen
    return writer
