"""One parameter's DTensor pieces over a pipeline stage, computed once per shape.

Every stage of a mesh has the same coordinates (only its first rank differs), and a model
repeats a few shapes layer after layer, so the pieces of one (shape, role) under one
layout are computed once, with ranks counted from the stage's first, and shared
(read-only) by every tensor and state entry that has them: 405B on 131,072 ranks has
1,137 parameters but 8 distinct piece sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from ckptbench.models import Role, TensorDef
from ckptbench.plan.expert import ep_splits
from ckptbench.plan.fsdp import fsdp_splits
from ckptbench.plan.mesh import stage_mesh
from ckptbench.plan.sharding import MAX_DIMS, chunk_geometry, numel
from ckptbench.plan.tensor_parallel import tp_splits
from ckptbench.spec import ParallelSpec


def _frozen(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.flags.writeable = False


@dataclass(frozen=True, eq=False)
class Pieces:
    """The distinct pieces of one tensor over a stage, in order of their first holder,
    and which stage-local ranks hold each (ascending)."""

    offsets: np.ndarray  # int64 [pieces, MAX_DIMS]
    sizes: np.ndarray  # int64 [pieces, MAX_DIMS]
    ndim: int
    first: np.ndarray  # int64 [pieces]: first holder
    count: np.ndarray  # int64 [pieces]: holders
    holders: np.ndarray  # int64 [sum(count)]: holders, piece by piece
    piece_of: np.ndarray  # int64 [ranks]: the piece each rank holds

    def __post_init__(self) -> None:
        _frozen(self.offsets, self.sizes, self.first, self.count, self.holders, self.piece_of)

    def __len__(self) -> int:
        return len(self.count)

    @cached_property
    def holder_ptr(self) -> np.ndarray:
        """Holders of piece g: holders[holder_ptr[g]:holder_ptr[g + 1]]."""
        out = np.concatenate([[0], np.cumsum(self.count)])
        _frozen(out)
        return out

    @cached_property
    def numel(self) -> np.ndarray:
        out: np.ndarray = numel(self.sizes, self.ndim)
        _frozen(out)
        return out

    @cached_property
    def replicated(self) -> np.ndarray:
        """Pieces held by more than one rank."""
        out = np.flatnonzero(self.count > 1)
        _frozen(out)
        return out

    @cached_property
    def unique_on_rank(self) -> np.ndarray:
        """bool [ranks]: the rank's piece is its own (one holder)."""
        out: np.ndarray = self.count[self.piece_of] == 1
        _frozen(out)
        return out


@lru_cache(maxsize=64)
def scalar_pieces(ranks: int) -> Pieces:
    """A 0-d tensor (Adam's ``step``): one piece that every rank of the stage holds."""
    return Pieces(np.zeros((1, MAX_DIMS), dtype=np.int64), np.ones((1, MAX_DIMS), dtype=np.int64),
                  0, np.zeros(1, dtype=np.int64), np.array([ranks], dtype=np.int64),
                  np.arange(ranks, dtype=np.int64), np.zeros(ranks, dtype=np.int64))


@lru_cache(maxsize=256)
def stage_pieces(shape: tuple[int, ...], role: Role, p: ParallelSpec) -> Pieces:
    """The pieces of a (shape, role) parameter over one stage of layout `p`: the
    composition of its splits (EP on experts, then TP, then FSDP on what TP left)."""
    mesh = stage_mesh(p, 0)
    t = TensorDef("", shape, role, None)
    splits = ep_splits(t, p.ep, mesh.shard) + tp_splits(t, p.tp, mesh.tp)
    splits += fsdp_splits(t, p.dp_shard, p.ep, mesh.shard)
    n = len(mesh.ranks)
    offsets, sizes = chunk_geometry(shape, splits, n)
    if splits:
        rows = np.concatenate([offsets, sizes], axis=1)
        _, first_pos, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        first_pos, inverse = np.zeros(1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    # Order pieces by their first holder, holders ascending within each piece.
    order = np.argsort(first_pos, kind="stable")
    piece_rank = np.empty_like(order)
    piece_rank[order] = np.arange(len(order))
    piece_of = piece_rank[inverse].astype(np.int64)
    holders = np.argsort(piece_of, kind="stable").astype(np.int64)
    count = np.bincount(piece_of, minlength=len(order)).astype(np.int64)
    first = first_pos[order].astype(np.int64)
    return Pieces(offsets[first], sizes[first], len(shape), first, count, holders, piece_of)
