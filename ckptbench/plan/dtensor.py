"""The DCP/torchtitan family: FSDP2, HSDP, tensor, pipeline and expert parallel, combined.

For every parameter, each rank's DTensor piece is the composition of the layouts' splits
(EP on experts, then TP, then FSDP on what TP left), computed for all ranks of the
parameter's pipeline stage at once. Identical pieces on several ranks (replicated norms,
HSDP replicas, ``step`` scalars) become one item with several holders, and DCP's dedup
picks the writer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptbench.models import TensorDef, model_tensors
from ckptbench.plan.core import Plan, StateKey, finalize
from ckptbench.plan.dedup import assign_writers
from ckptbench.plan.expert import ep_splits
from ckptbench.plan.files import (
    SHARED_FILE_NAME,
    chunk_file_name,
    dcp_buckets,
    dcp_file_name,
    per_rank_file_name,
)
from ckptbench.plan.fsdp import fsdp_splits
from ckptbench.plan.mesh import StageMesh, stage_mesh
from ckptbench.plan.pipeline import split_by_stage
from ckptbench.plan.sharding import MAX_DIMS, chunk_geometry, numel
from ckptbench.plan.state import PARAM_GROUP_ITEMS, StateEntry, model_entry, optimizer_entries
from ckptbench.plan.tensor_parallel import tp_splits
from ckptbench.spec import DTYPE_BYTES, Workload


class _Items:
    """Plan items before dedup, collected as lists of arrays and concatenated once."""

    def __init__(self) -> None:
        self.key: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []
        self.sizes: list[np.ndarray] = []
        self.nbytes: list[np.ndarray] = []
        self.first: list[np.ndarray] = []
        self.count: list[np.ndarray] = []
        self.holders: list[np.ndarray] = []

    def add(self, key: int, offsets: np.ndarray, sizes: np.ndarray, nbytes: np.ndarray,
            first: np.ndarray, count: np.ndarray, holders: np.ndarray) -> None:
        self.key.append(np.full(len(offsets), key, dtype=np.int32))
        self.offsets.append(offsets)
        self.sizes.append(sizes)
        self.nbytes.append(nbytes)
        self.first.append(first)
        self.count.append(count)
        self.holders.append(holders)


def piece_groups(t: TensorDef, w: Workload, mesh: StageMesh) -> Any:
    """Distinct pieces of one parameter over its stage, and which ranks hold each."""
    p = w.parallel
    splits = ep_splits(t, p.ep, mesh.shard) + tp_splits(t, p.tp, mesh.tp)
    splits += fsdp_splits(t, p.dp_shard, p.ep, mesh.shard)
    n = len(mesh.ranks)
    offsets, sizes = chunk_geometry(t.shape, splits, n)
    if splits:
        rows = np.concatenate([offsets, sizes], axis=1)
        _, first_pos, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        first_pos, inverse = np.zeros(1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    # Order groups by their first holder, holders ascending within each group.
    group_order = np.argsort(first_pos, kind="stable")
    rank_of_group = np.empty_like(group_order)
    rank_of_group[group_order] = np.arange(len(group_order))
    g = rank_of_group[inverse]
    by_group = np.argsort(g, kind="stable")
    holders = mesh.ranks[by_group]
    count = np.bincount(g, minlength=len(group_order))
    first_idx = first_pos[group_order]
    return offsets[first_idx], sizes[first_idx], mesh.ranks[first_idx], count, holders


def _add_entry(items: _Items, keys: list[StateKey], entry: StateEntry, t: TensorDef,
               geometry: tuple[Any, ...], mesh: StageMesh) -> None:
    ndim = 0 if entry.scalar else len(t.shape)
    keys.append(StateKey(entry.name, entry.dtype, () if entry.scalar else t.shape))
    kid = len(keys) - 1
    itemsize = DTYPE_BYTES[entry.dtype]
    if entry.scalar:
        offsets = np.zeros((1, MAX_DIMS), dtype=np.int64)
        sizes = np.ones((1, MAX_DIMS), dtype=np.int64)
        items.add(kid, offsets, sizes, np.array([itemsize], dtype=np.int64),
                  mesh.ranks[:1], np.array([len(mesh.ranks)]), mesh.ranks)
        return
    offsets, sizes, first, count, holders = geometry
    items.add(kid, offsets, sizes, numel(sizes, ndim) * itemsize, first, count, holders)


def build_dtensor_plan(w: Workload) -> Plan:
    p = w.parallel
    by_stage = split_by_stage(model_tensors(w.model), w.model.layers, p.pp)
    items = _Items()
    keys: list[StateKey] = []
    # Model entries of every parameter first, then optimizer entries, so that sorting a
    # rank's items by key id gives DCP's flattening order.
    geometries: list[tuple[TensorDef, StageMesh, tuple[Any, ...]]] = []
    for stage, tensors in enumerate(by_stage):
        mesh = stage_mesh(p, stage)
        for t in tensors:
            geometry = piece_groups(t, w, mesh)
            geometries.append((t, mesh, geometry))
            _add_entry(items, keys, model_entry(t, w.state), t, geometry, mesh)
    for t, mesh, geometry in geometries:
        for entry in optimizer_entries(t, w.state):
            _add_entry(items, keys, entry, t, geometry, mesh)

    key = np.concatenate(items.key)
    offsets = np.concatenate(items.offsets)
    sizes = np.concatenate(items.sizes)
    nbytes = np.concatenate(items.nbytes)
    first = np.concatenate(items.first)
    count = np.concatenate(items.count)
    holders = np.concatenate(items.holders)
    # DCP weighs each write item by its *global* tensor bytes when balancing writers.
    global_bytes = np.array([int(np.prod(k.global_shape, dtype=np.int64)) * k.itemsize
                             for k in keys], dtype=np.int64)
    weight = global_bytes[key]
    if w.state.optimizer == "adamw":
        # The optimizer's param_groups entries are non-tensor items every rank holds,
        # last in each plan; DCP counts each as 1 byte. They are not written here, but
        # they take part in the writer choice so that ties break as in DCP.
        extra = len(PARAM_GROUP_ITEMS)
        everyone = np.arange(p.world_size, dtype=np.int32)
        key = np.concatenate([key, np.arange(len(keys), len(keys) + extra, dtype=np.int32)])
        offsets = np.concatenate([offsets, np.zeros((extra, offsets.shape[1]), dtype=np.int64)])
        sizes = np.concatenate([sizes, np.ones((extra, sizes.shape[1]), dtype=np.int64)])
        nbytes = np.concatenate([nbytes, np.zeros(extra, dtype=np.int64)])
        weight = np.concatenate([weight, np.ones(extra, dtype=np.int64)])
        first = np.concatenate([first, np.zeros(extra, dtype=np.int32)])
        count = np.concatenate([count, np.full(extra, p.world_size)])
        holders = np.concatenate([holders, np.tile(everyone, extra)])
    holder_ptr = np.concatenate([[0], np.cumsum(count)])

    # Stream order: by first holder, then plan order (key id) within the holder's plan.
    order = np.lexsort((key, first))
    holder_index = gather_ranges(holder_ptr, order)
    counts_sorted = count[order]
    ptr_sorted = np.concatenate([[0], np.cumsum(counts_sorted)])
    writer = assign_writers(first[order], ptr_sorted, holders[holder_index], weight[order],
                            p.world_size)
    real = key[order] < len(keys)
    order, writer = order[real], writer[real]
    key, offsets, sizes, nbytes = key[order], offsets[order], sizes[order], nbytes[order]

    # Each rank's items in plan order (key id), then grouped into files.
    by_rank = np.lexsort((key, writer))
    key, offsets, sizes, nbytes, writer = (a[by_rank] for a in (key, offsets, sizes, nbytes, writer))
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
        chunk_file = writer.astype(np.int64)
        file_paths = [per_rank_file_name(r) if files == "per-rank" else SHARED_FILE_NAME
                      for r in range(p.world_size)]
        file_rank = np.arange(p.world_size)
    else:
        threads = w.checkpoint.threads
        chunk_file = writer.astype(np.int64) * threads
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
    total = int(lengths.sum())
    out_ptr = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.arange(total, dtype=np.int64)
    seg = np.repeat(np.arange(len(order)), lengths)
    out: np.ndarray = starts[seg] + (idx - out_ptr[seg])
    return out
