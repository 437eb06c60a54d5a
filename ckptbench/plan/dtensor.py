"""The DCP/torchtitan family: FSDP2, HSDP, tensor, pipeline and expert parallel, combined.

For every parameter, each rank's DTensor piece is the composition of the layouts' splits
(EP on experts, then TP, then FSDP on what TP left), computed once per (shape, role) for
a stage and shared by every stage and state entry (plan.pieces). Identical pieces on
several ranks (replicated norms, HSDP replicas, ``step`` scalars) have one writer, chosen
as DCP's dedup does.

Every rank of a stage holds one piece of every key of the stage, so a stage is a dense
(key x rank) table of piece numbers: no per-item sort is needed to find each rank's
chunks in plan order (a rank's chunks are the keys, in id order, whose piece it
writes), and plans for 131,072 ranks (16.6 million chunks) are built stage by stage
straight into the plan's arrays.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.models import TensorDef, model_tensors
from ckptbench.plan.core import Plan, StateKey, finalize
from ckptbench.plan.dedup import assign_replicated
from ckptbench.plan.files import (
    SHARED_FILE_NAME,
    chunk_file_name,
    dcp_buckets,
    dcp_file_name,
    per_rank_file_name,
)
from ckptbench.plan.mesh import StageMesh
from ckptbench.plan.pieces import Pieces, scalar_pieces, stage_pieces
from ckptbench.plan.pipeline import split_by_stage
from ckptbench.plan.sharding import MAX_DIMS
from ckptbench.plan.state import PARAM_GROUP_ITEMS, model_entry, optimizer_entries
from ckptbench.spec import Workload


def piece_groups(t: TensorDef, w: Workload, mesh: StageMesh) -> Any:
    """Distinct pieces of one parameter over its stage, and which ranks hold each:
    (offsets, sizes, first holder, holder count, holders), ranks global."""
    pieces = stage_pieces(t.shape, t.role, w.parallel)
    r0 = int(mesh.ranks[0])
    return (pieces.offsets, pieces.sizes, (pieces.first + r0).astype(np.int32), pieces.count,
            (pieces.holders + r0).astype(np.int32))


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage: its ranks, and its keys (ids ascending) with their pieces."""

    first_rank: int
    ranks: int
    key_ids: np.ndarray  # int64 [keys]
    pieces: list[Pieces]
    base: int  # index of the stage's first piece among all the plan's pieces

    @property
    def key_base(self) -> np.ndarray:
        """Index of each key's first piece, counted from the stage's first."""
        return np.concatenate([[0], np.cumsum([len(pc) for pc in self.pieces])])

    def table(self) -> np.ndarray:
        """int64 [keys, ranks]: the piece (stage-wide index) of every key on every rank."""
        out = np.empty((len(self.pieces), self.ranks), dtype=np.int64)
        for k, (b, pc) in enumerate(zip(self.key_base[:-1].tolist(), self.pieces, strict=True)):
            np.add(pc.piece_of, b, out=out[k])
        return out


def _stages(w: Workload, keys: list[StateKey]) -> list[_Stage]:
    """The stages, filling `keys`: model entries of every parameter first, then optimizer
    entries parameter by parameter (DCP's flattening order is key id order)."""
    p = w.parallel
    per_stage = p.world_size // p.pp
    by_stage = split_by_stage(model_tensors(w.model), w.model.layers, p.pp)
    entries: list[list[tuple[int, Pieces]]] = [[] for _ in by_stage]
    for stage, tensors in enumerate(by_stage):
        for t in tensors:
            e = model_entry(t, w.state)
            entries[stage].append((len(keys), stage_pieces(t.shape, t.role, p)))
            keys.append(StateKey(e.name, e.dtype, t.shape))
    for stage, tensors in enumerate(by_stage):
        for t in tensors:
            for e in optimizer_entries(t, w.state):
                pieces = scalar_pieces(per_stage) if e.scalar else stage_pieces(t.shape, t.role, p)
                entries[stage].append((len(keys), pieces))
                keys.append(StateKey(e.name, e.dtype, () if e.scalar else t.shape))
    out: list[_Stage] = []
    base = 0
    for stage, es in enumerate(entries):
        stage_pieces_ = [pc for _, pc in es]
        out.append(_Stage(stage * per_stage, per_stage, np.array([k for k, _ in es], dtype=np.int64),
                          stage_pieces_, base))
        base += sum(len(pc) for pc in stage_pieces_)
    return out


class _Replicated:
    """Replicated items (pieces with several holders), collected stage by stage."""

    def __init__(self) -> None:
        self.first: list[np.ndarray] = []
        self.key: list[np.ndarray] = []
        self.own: list[np.ndarray] = []
        self.set_id: list[np.ndarray] = []
        self.slot: list[np.ndarray] = []
        self.set_base: list[int] = []  # holder sets: (first rank, pieces) from set_base on
        self.set_source: list[tuple[int, Pieces | None]] = []
        self._bases: dict[tuple[int, int], int] = {}
        self._next = 0

    def set_of(self, first_rank: int, pieces: Pieces | None, size: int) -> int:
        ident = (first_rank, id(pieces))
        if ident not in self._bases:
            self._bases[ident] = self._next
            self.set_base.append(self._next)
            self.set_source.append((first_rank, pieces))
            self._next += size
        return self._bases[ident]

    def add(self, first: np.ndarray, key: int, own: np.ndarray, set_id: np.ndarray,
            slot: np.ndarray) -> None:
        self.first.append(first)
        self.key.append(np.full(len(first), key, dtype=np.int64))
        self.own.append(own)
        self.set_id.append(set_id)
        self.slot.append(slot)

    def holders_of(self, sid: int, world_size: int) -> np.ndarray:
        i = bisect_right(self.set_base, sid) - 1
        first_rank, pieces = self.set_source[i]
        if pieces is None:  # everyone
            return np.arange(world_size, dtype=np.int64)
        g = sid - self.set_base[i]
        ptr = pieces.holder_ptr
        out: np.ndarray = pieces.holders[ptr[g]:ptr[g + 1]] + first_rank
        return out


def _writers(w: Workload, stages: list[_Stage], weight: np.ndarray, n_keys: int) -> np.ndarray:
    """The writer rank of every piece (all the plan's pieces, stage by stage), as DCP's
    dedup chooses it."""
    total = stages[-1].base + sum(len(pc) for pc in stages[-1].pieces) if stages else 0
    writer = np.empty(total, dtype=np.int32)
    rep = _Replicated()
    rank0_unique = 0
    for st in stages:
        if not st.pieces:
            continue
        # Unique weight of each rank's block before each key: what `own` adds in dedup,
        # needed only on the ranks that are first holders of a replicated piece.
        leads = np.unique(np.concatenate([[0]] + [pc.first[pc.replicated] for pc in st.pieces]))
        unique = (np.stack([pc.unique_on_rank[leads] for pc in st.pieces])
                  * np.maximum(weight[st.key_ids], 1)[:, None])
        own = np.cumsum(unique, axis=0) - unique
        if st.first_rank == 0:
            rank0_unique = int(unique[:, 0].sum())
        for k, (b, pc) in enumerate(zip(st.key_base[:-1].tolist(), st.pieces, strict=True)):
            start = st.base + b
            writer[start:start + len(pc)] = pc.first + st.first_rank
            g = pc.replicated
            if len(g):
                sbase = rep.set_of(st.first_rank, pc, len(pc))
                rep.add(pc.first[g] + st.first_rank, int(st.key_ids[k]),
                        own[k, np.searchsorted(leads, pc.first[g])], sbase + g, start + g)
    if w.state.optimizer == "adamw" and w.parallel.world_size > 1:
        # The optimizer's param_groups entries are non-tensor items every rank holds,
        # last in each plan (1 byte each for DCP). They are not written here, but they
        # take part in the writer choice so that ties break as in DCP.
        extra = len(PARAM_GROUP_ITEMS)
        everyone = rep.set_of(-1, None, 1)
        for i in range(extra):
            rep.add(np.zeros(1, dtype=np.int64), n_keys + i, np.array([rank0_unique]),
                    np.array([everyone]), np.array([-1]))
    if not rep.first:
        return writer
    first, key = np.concatenate(rep.first), np.concatenate(rep.key)
    order = np.lexsort((key, first))  # stream order: by block (first holder), then plan order
    weights = np.concatenate([np.maximum(weight, 1), np.ones(len(PARAM_GROUP_ITEMS), np.int64)])
    chosen = assign_replicated(np.concatenate(rep.set_id)[order], np.concatenate(rep.own)[order],
                               weights[key[order]],
                               lambda sid: rep.holders_of(sid, w.parallel.world_size),
                               w.parallel.world_size)
    slot = np.concatenate(rep.slot)[order]
    real = slot >= 0
    writer[slot[real]] = chosen[real]
    return writer


def _chunks(stages: list[_Stage], writer: np.ndarray, itemsize: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every rank's chunks in plan order (rank by rank, key id within a rank):
    (key, offsets, sizes, nbytes, writer)."""
    n = len(writer)
    key = np.empty(n, dtype=np.int32)
    offsets = np.empty((n, MAX_DIMS), dtype=np.int64)
    sizes = np.empty((n, MAX_DIMS), dtype=np.int64)
    nbytes = np.empty(n, dtype=np.int64)
    by = np.empty(n, dtype=np.int32)
    pos = 0
    for st in stages:
        if not st.pieces:
            continue
        table = st.table()
        writes = writer[st.base + table] == st.first_rank + np.arange(st.ranks)
        rank, k = np.nonzero(writes.T)  # rank by rank, keys ascending
        piece = table[k, rank]
        del table, writes
        end = pos + len(rank)
        np.take(st.key_ids, k, out=key[pos:end])
        np.take(np.concatenate([pc.offsets for pc in st.pieces]), piece, axis=0, out=offsets[pos:end])
        np.take(np.concatenate([pc.sizes for pc in st.pieces]), piece, axis=0, out=sizes[pos:end])
        np.take(np.concatenate([pc.numel for pc in st.pieces]), piece, out=nbytes[pos:end])
        nbytes[pos:end] *= itemsize[st.key_ids[k]]
        np.add(rank, st.first_rank, out=by[pos:end], casting="unsafe")
        pos = end
    assert pos == n, "every piece has one writer"
    return key, offsets, sizes, nbytes, by


def build_dtensor_plan(w: Workload) -> Plan:
    p = w.parallel
    keys: list[StateKey] = []
    stages = _stages(w, keys)
    itemsize = np.array([k.itemsize for k in keys], dtype=np.int64)
    # DCP weighs each write item by its *global* tensor bytes when balancing writers.
    global_bytes = np.array([int(np.prod(k.global_shape, dtype=np.int64)) for k in keys],
                            dtype=np.int64) * itemsize
    writer = _writers(w, stages, global_bytes, len(keys))
    key, offsets, sizes, nbytes, writer = _chunks(stages, writer, itemsize)
    files = w.checkpoint.files
    if files == "per-chunk":
        file_paths = [chunk_file_name(keys[k].name, offsets[i, : len(keys[k].global_shape)])
                      for i, k in enumerate(key.tolist())]
        chunk_file = np.arange(len(key), dtype=np.int64)
        file_rank = writer
        # Files must be listed rank by rank: they already are (sorted by writer).
    elif files in ("per-rank", "shared"):
        # One entry per rank, items in plan order: N-N files, or N-1 regions of one file
        # (plan.files.region_layout places them).
        chunk_file = writer
        file_paths = [per_rank_file_name(r) if files == "per-rank" else SHARED_FILE_NAME
                      for r in range(p.world_size)]
        file_rank = np.arange(p.world_size)
    else:
        threads = w.checkpoint.threads
        chunk_file = writer.astype(np.int64) * threads if threads > 1 else writer
        if threads > 1:
            rank_start = np.searchsorted(writer, np.arange(p.world_size + 1))
            within = np.zeros(len(key), dtype=np.int64)
            reorder = np.arange(len(key))
            for r in range(p.world_size):
                a, b = int(rank_start[r]), int(rank_start[r + 1])
                if a == b:
                    continue
                within[a:b] = dcp_buckets(global_bytes[key[a:b]], threads)
                # Inside a bucket DCP writes items largest first (its sort order).
                reorder[a:b] = a + np.argsort(-global_bytes[key[a:b]], kind="stable")
            chunk_file += within
            key, offsets, sizes, nbytes, chunk_file = (
                a[reorder] for a in (key, offsets, sizes, nbytes, chunk_file))
        file_paths = [dcp_file_name(r, k) for r in range(p.world_size) for k in range(threads)]
        file_rank = np.repeat(np.arange(p.world_size), threads)
    return finalize(w, keys, key, offsets, sizes, nbytes, chunk_file, file_paths, file_rank,
                    checkpoint_dir="checkpoint-{step}")


def gather_ranges(ptr: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Concatenate ranges [ptr[i], ptr[i+1]) for i in order, vectorized."""
    starts = ptr[order]
    lengths = ptr[order + 1] - starts
    out_start = np.cumsum(lengths) - lengths
    out: np.ndarray = np.repeat(starts - out_start, lengths)
    out += np.arange(len(out), dtype=out.dtype)
    return out
