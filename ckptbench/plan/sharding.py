"""Chunk arithmetic shared by every layout: torch.chunk-style splits, vectorized over ranks.

A DTensor ``Shard(d)`` over ``k`` ranks cuts dimension ``d`` into pieces of
``ceil(n / k)``; the last pieces are smaller or empty. DTensor reports an empty piece at
offset ``n`` (the end of the global dimension, even inside a TP block: torch 2.15's
``_get_shard_size_and_offsets``), and DCP keys chunks by offset, so we do too.
Splits compose: a later split cuts the *local* extent left by the earlier ones (FSDP2 on
top of tensor parallel cuts each TP piece again, DTensor's strided sharding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_DIMS = 3


@dataclass(frozen=True)
class Split:
    """Cut dimension `dim` into `parts` pieces; each rank takes piece `index[rank]`."""

    dim: int
    parts: int
    index: np.ndarray  # per rank, values in [0, parts)


def chunk_geometry(
    shape: tuple[int, ...], splits: list[Split], nranks: int
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets and sizes (int64 [nranks, MAX_DIMS], padded with 0 / 1) of each rank's piece."""
    offsets = np.zeros((nranks, MAX_DIMS), dtype=np.int64)
    sizes = np.ones((nranks, MAX_DIMS), dtype=np.int64)
    sizes[:, : len(shape)] = shape
    for split in splits:
        if split.parts == 1:
            continue
        local = sizes[:, split.dim]
        full = (local + split.parts - 1) // split.parts
        start = full * split.index
        empty = start >= local
        piece = np.where(empty, 0, np.minimum(local, start + full) - start)
        # torch 2.15 places an empty piece at the end of the *global* dimension, also
        # when an earlier split (TP) left a block that ends inside the tensor
        offsets[:, split.dim] = np.where(empty, shape[split.dim], offsets[:, split.dim] + start)
        sizes[:, split.dim] = piece
    return offsets, sizes


def numel(sizes: np.ndarray, ndim: int) -> np.ndarray:
    """Elements per row of a sizes array, counting only the tensor's real dimensions."""
    if ndim == 0:
        return np.ones(len(sizes), dtype=np.int64)
    out: np.ndarray = np.prod(sizes[:, :ndim], axis=1)
    return out
