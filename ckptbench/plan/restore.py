"""The restore plan: which saved chunks each rank of the restore layout reads, as DCP loads.

torch DCP's default load planner gives every tensor a rank holds in the layout it restarts
with (its DTensor piece there) one read item per **saved chunk that overlaps** the piece,
with torch's overlap test (``o1 < o2 + s2 and o2 < o1 + s1`` in every dimension, so an
empty piece strictly inside a saved chunk still reads it), and ``FileSystemReader`` reads
each item's whole storage range. So a rank reads every overlapping saved chunk **whole**,
from whichever file holds it, and state written once (HSDP replicas, TP-replicated norms,
``step`` scalars) is read by every rank that holds it.

Order, as DCP's: a rank's read items follow its flattened state dict (model keys, then
optimizer keys parameter by parameter; the save plan's key ids are that order), and for
one key the saved chunks in metadata order (by writer rank); ``read_data`` then visits the
files in order of first appearance, each file's items in that order.

The Megatron-DeepSpeed layout (DLIO) reads back exactly the files each rank wrote.

Plans for 16k ranks hold millions of reads, so a restore plan is two arrays: the saved
chunk of every read (an index into the save plan's chunk table), rank by rank, and each
rank's first read.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ckptbench.models import model_tensors
from ckptbench.plan.bounds import check_restore_size
from ckptbench.plan.core import Plan
from ckptbench.plan.dtensor import gather_ranges, piece_groups
from ckptbench.plan.mesh import stage_mesh
from ckptbench.plan.order import lex_order, stable_argsort
from ckptbench.plan.pipeline import split_by_stage
from ckptbench.plan.sharding import MAX_DIMS
from ckptbench.plan.state import model_entry, optimizer_entries
from ckptbench.spec import ParallelSpec

RESTORE_PLAN_SCHEMA = "ckptbench.restoreplan/1"
READ_BLOCK = 1 << 22


@dataclass(frozen=True, eq=False)
class RestorePlan:
    """Reads of every rank of the restore layout (`layout`) from the checkpoint `save`."""

    save: Plan
    layout: ParallelSpec
    read_chunk: np.ndarray  # int64 [reads]: saved chunk of each read, rank by rank, DCP order
    rank_ptr: np.ndarray  # int64 [world_size + 1]: the reads of rank r are [ptr[r], ptr[r+1])
    source: str  # "dcp" (DCP's default load planner) or "dlio" (what DLIO reads back)

    def __post_init__(self) -> None:
        for name in ("read_chunk", "rank_ptr"):
            a = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            a.flags.writeable = False
            object.__setattr__(self, name, a)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def n_reads(self) -> int:
        return len(self.read_chunk)

    def reads_of_rank(self, rank: int) -> np.ndarray:
        """Saved chunk indices rank `rank` reads, in order."""
        return self.read_chunk[self.rank_ptr[rank]:self.rank_ptr[rank + 1]]

    def read_bytes(self) -> np.ndarray:
        """Payload bytes of every read, int64 [reads]."""
        out: np.ndarray = self.save.chunk_nbytes[self.read_chunk]
        return out

    def rank_bytes(self) -> np.ndarray:
        """Bytes each rank of the restore layout reads, int64 [world_size]."""
        csum = self.read_bytes()
        np.cumsum(csum, out=csum)
        ends = self.rank_ptr - 1
        before = np.where(ends >= 0, csum[np.maximum(ends, 0)] if len(csum) else 0, 0)
        out: np.ndarray = np.diff(before).astype(np.int64)
        return out

    def bytes_of_ranks(self, ranks: list[int]) -> int:
        return int(self.rank_bytes()[ranks].sum()) if ranks else 0

    @property
    def total_bytes(self) -> int:
        """Bytes all ranks read together."""
        return int(self.read_bytes().sum())

    @property
    def amplification(self) -> float:
        """Bytes read / checkpoint bytes (1.0: every saved byte read once)."""
        saved = self.save.total_bytes
        return self.total_bytes / saved if saved else 0.0

    def read_ranks(self) -> np.ndarray:
        """The restore rank of every read, int64 [reads]."""
        return np.repeat(np.arange(self.world_size, dtype=np.int64), np.diff(self.rank_ptr))

    def file_readers(self) -> np.ndarray:
        """Distinct ranks reading each file of the checkpoint (its fan-in), int64 [files]."""
        out = np.zeros(self.save.n_files, dtype=np.int64)
        # Ranks in blocks of about READ_BLOCK reads: 43 million reads at 131,072 ranks would
        # otherwise take a few GB of temporaries.
        ptr = self.rank_ptr
        bounds = np.unique(np.searchsorted(ptr, np.arange(0, int(ptr[-1]), READ_BLOCK)))
        for a, b in zip([0, *bounds[1:].tolist()], [*bounds[1:].tolist(), self.world_size],
                        strict=True):
            chunks = self.read_chunk[ptr[a]:ptr[b]]
            nonempty = self.save.chunk_nbytes[chunks] > 0
            files = self.save.chunk_file[chunks[nonempty]]
            ranks = np.repeat(np.arange(a, b), np.diff(ptr[a:b + 1]))[nonempty]
            # A rank's reads of one file are consecutive (DCP reads file by file), so each
            # run of (rank, file) is one distinct reader of the file.
            starts = np.ones(len(files), dtype=bool)
            starts[1:] = (files[1:] != files[:-1]) | (ranks[1:] != ranks[:-1])
            out += np.bincount(files[starts], minlength=self.save.n_files)
        return out


def build_restore_plan(plan: Plan) -> RestorePlan:
    """The restore plan of `plan`'s checkpoint onto its workload's restore layout."""
    w = plan.workload
    if w.parallel.layout == "megatron-deepspeed":
        return own_files_plan(plan, "dlio")
    check_restore_size(w)
    world = w.restore_parallel.world_size
    pos, _ = _chunk_positions(plan)
    counts = np.zeros(world, dtype=np.int64)
    parts: list[np.ndarray] = []
    # Stage by stage: a stage's ranks are consecutive and read only its tensors.
    for first_rank, ranks, rank, chunk in _dcp_reads(plan):
        parts.append(chunk[_dcp_order(plan, pos, rank, chunk)])
        counts[first_rank:first_rank + ranks] = np.bincount(rank, minlength=ranks)
    read_chunk = np.concatenate(parts, dtype=np.int64) if parts else np.zeros(0, dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(counts)])
    return RestorePlan(plan, w.restore_parallel, read_chunk, ptr, "dcp")


_BUILT: weakref.WeakKeyDictionary[Plan, RestorePlan] = weakref.WeakKeyDictionary()


def restore_plan_of(plan: Plan) -> RestorePlan:
    """The restore plan of `plan`, built once per plan (processes forked after the first
    call share it)."""
    rplan = _BUILT.get(plan)
    if rplan is None:
        rplan = _BUILT[plan] = build_restore_plan(plan)
    return rplan


def own_files_plan(plan: Plan, source: str) -> RestorePlan:
    """Every rank reads back the files it wrote, whole, in plan order (DLIO's load; the
    restore layout is the training layout)."""
    file_ptr = np.searchsorted(plan.chunk_file, np.arange(plan.n_files + 1))
    rank_first_file = np.searchsorted(plan.file_rank, np.arange(plan.world_size + 1))
    return RestorePlan(plan, plan.workload.parallel, np.arange(plan.n_chunks),
                       file_ptr[rank_first_file], source)


def restore_pieces(rplan: RestorePlan, rank: int) -> list[tuple[int, tuple[int, ...],
                                                                tuple[int, ...]]]:
    """What restore rank `rank` holds before it loads, as (key id, offsets, sizes) in key
    order: its DTensor piece of every state-dict key of its stage in the restore layout
    (empty pieces included, placed as torch places them), a 0-d ``step`` whole; with the
    DLIO plan, the chunks it wrote. A DCP load into these pieces reads the plan's reads."""
    plan = rplan.save
    if rplan.source != "dcp":
        chunks = [i for f in plan.files_of_rank(rank) for i in plan.chunks_of_file(f)]
        return sorted((int(plan.chunk_key[i]), plan.chunk(i).offsets, plan.chunk(i).sizes)
                      for i in chunks)
    return layout_pieces(plan, plan.workload.restore_parallel, rank)


def held_pieces(plan: Plan, rank: int) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """What plan rank `rank` holds when it saves, as (key id, offsets, sizes) in key order:
    its DTensor piece of every key of its stage, replicated pieces and empty ones included
    -- the tensor items of its local plan, before DCP's dedup keeps one holder of each."""
    return layout_pieces(plan, plan.workload.parallel, rank)


def layout_pieces(plan: Plan, layout: ParallelSpec, rank: int
                  ) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """Rank `rank`'s piece of every state-dict key of its stage under `layout` (the DCP
    family), as (key id, offsets, sizes) in key order; a 0-d ``step`` whole."""
    w = plan.workload
    restore_w = replace(w, parallel=layout)
    key_ids = {k.name: i for i, k in enumerate(plan.keys)}
    out: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    by_stage = split_by_stage(model_tensors(w.model), w.model.layers, layout.pp)
    for stage, tensors in enumerate(by_stage):
        mesh = stage_mesh(layout, stage)
        if rank not in mesh.ranks:
            continue
        for t in tensors:
            g_off, g_size, _first, g_count, holders = piece_groups(t, restore_w, mesh)
            at = int(np.flatnonzero(holders == rank)[0])
            g = int(np.searchsorted(np.cumsum(g_count), at, side="right"))
            nd = len(t.shape)
            off = tuple(int(x) for x in g_off[g, :nd])
            size = tuple(int(x) for x in g_size[g, :nd])
            for entry in [model_entry(t, w.state), *optimizer_entries(t, w.state)]:
                out.append((key_ids[entry.name], *(((), ()) if entry.scalar else (off, size))))
    return sorted(out)


def _dcp_reads(plan: Plan) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """Per restore stage: (first rank, ranks, stage-local rank of every read, saved chunk
    of every read), keys in id order and, for one key, reads by rank then by the
    saved chunks' canonical order (offsets, then sizes)."""
    w = plan.workload
    layout = w.restore_parallel
    restore_w = replace(w, parallel=layout)
    key_ids = {k.name: i for i, k in enumerate(plan.keys)}
    off, size = plan.chunk_offsets, plan.chunk_sizes
    # Each key's chunks in one canonical order (by offsets, then sizes): all the keys of
    # a parameter have the same pieces, so position p means the same piece in each.
    canon = lex_order((size[:, 2], size[:, 1], size[:, 0], off[:, 2], off[:, 1], off[:, 0],
                       plan.chunk_key)).astype(np.int32 if plan.n_chunks < 2**31 else np.int64)
    key_ptr = np.concatenate([[0], np.cumsum(np.bincount(plan.chunk_key, minlength=len(plan.keys)))])
    by_stage = split_by_stage(model_tensors(w.model), w.model.layers, layout.pp)
    # Layers repeat: tensors of one shape and role have the same pieces in every stage
    # (ranks aside) and the same saved chunks, so their overlaps are computed once.
    cache: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    for stage, tensors in enumerate(by_stage):
        mesh = stage_mesh(layout, stage)
        first_rank, ranks = int(mesh.ranks[0]), len(mesh.ranks)
        blocks: list[tuple[int, np.ndarray, np.ndarray]] = []
        for t in tensors:
            k0 = key_ids[f"model.{t.fqn}"]
            a, b = int(key_ptr[k0]), int(key_ptr[k0 + 1])
            saved = canon[a:b]
            hit = cache.get((t.shape, t.role))
            if hit is None or not (np.array_equal(hit[0], off[saved])
                                   and np.array_equal(hit[1], size[saved])):
                g_off, g_size, _first, g_count, holders = piece_groups(t, restore_w, mesh)
                group, pos = overlaps(g_off, g_size, off[saved], size[saved], len(t.shape))
                holder_ptr = np.concatenate([[0], np.cumsum(g_count)])
                local = holders[gather_ranges(holder_ptr, group)].astype(np.int64) - first_rank
                pos = np.repeat(pos, g_count[group])
                by_rank = lex_order((pos, local))
                hit = cache[(t.shape, t.role)] = (off[saved], size[saved],
                                                  local[by_rank].astype(np.int32), pos[by_rank])
            for entry in [model_entry(t, w.state), *optimizer_entries(t, w.state)]:
                k = key_ids[entry.name]
                if entry.scalar:  # a plain 0-d tensor: every rank of the stage reads it
                    blocks.append((k, np.arange(ranks, dtype=np.int32),
                                   np.full(ranks, canon[key_ptr[k]], dtype=np.int32)))
                    continue
                if key_ptr[k + 1] - key_ptr[k] != b - a:
                    raise ValueError(f"{entry.name}: pieces differ from model.{t.fqn}'s")
                blocks.append((k, hit[2], canon[key_ptr[k] + hit[3]]))
        if blocks:
            blocks.sort(key=lambda block: block[0])
            yield (first_rank, ranks, np.concatenate([bl[1] for bl in blocks]),
                   np.concatenate([bl[2] for bl in blocks]))


def _dcp_order(plan: Plan, pos: np.ndarray, rank: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """Permutation putting one stage's reads (as _dcp_reads gives them) in DCP's order: by
    rank; inside a rank, files in order of first appearance in the load plan (key, then
    the key's chunks in DCP's order), items in that order."""
    n = len(rank)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    # Reads come by key, then rank, then (nearly always) DCP's chunk order: a position
    # that does not grow inside a (key, rank) is the exception, sorted for.
    kp = plan.chunk_key[chunk].astype(np.int64) * (int(pos.max()) + 1) + pos[chunk]
    if np.any((rank[1:] == rank[:-1]) & (kp[1:] <= kp[:-1])):
        order = lex_order((kp, rank))
        rank, chunk = rank[order], chunk[order]
    else:
        order = None
    del kp
    # Group each rank's reads by file, reads in (key, position) order in each group; then
    # put a rank's groups in order of their first read.
    files = plan.chunk_file[chunk]
    grouped = stable_argsort(files - files.min())
    grouped = grouped[stable_argsort(rank[grouped])]
    r, f = rank[grouped], files[grouped]
    starts = np.flatnonzero(np.concatenate([[True], (r[1:] != r[:-1]) | (f[1:] != f[:-1])]))
    first = grouped[starts]
    r_first = r[starts]
    del r, f
    if not np.all((r_first[1:] > r_first[:-1]) | (first[1:] > first[:-1])):
        runs = lex_order((first, r_first))
        grouped = grouped[gather_ranges(np.concatenate([starts, [n]]), runs)]
    out: np.ndarray = grouped if order is None else order[grouped]
    return out


def _chunk_positions(plan: Plan) -> tuple[np.ndarray, int]:
    """Each saved chunk's place among its key's chunks in DCP's read order, and the most
    chunks any key has. torch 2.15 sweeps the saved chunks along the key's longest
    dimension (the first of equals) and emits overlaps by (end on that dimension, index
    in the metadata); the metadata lists chunks by writer rank."""
    shapes = np.ones((len(plan.keys), MAX_DIMS), dtype=np.int64)
    ndims = np.zeros(len(plan.keys), dtype=np.int64)
    for i, k in enumerate(plan.keys):
        shapes[i, :len(k.global_shape)] = k.global_shape
        ndims[i] = len(k.global_shape)
    sweep = np.argmax(shapes, axis=1)[plan.chunk_key]
    rows = np.arange(plan.n_chunks)
    end = plan.chunk_offsets[rows, sweep] + plan.chunk_sizes[rows, sweep]
    end = np.where(ndims[plan.chunk_key] == 0, 1, end)
    writer = plan.file_rank[plan.chunk_file]
    # Chunks come rank by rank (files are listed by rank), so a stable sort by (key, end)
    # keeps them by writer within ties.
    by_writer = bool(np.all(writer[1:] >= writer[:-1]))
    order = lex_order((end, plan.chunk_key) if by_writer else (writer, end, plan.chunk_key))
    key_start = np.concatenate([[0], np.cumsum(np.bincount(plan.chunk_key,
                                                           minlength=len(plan.keys)))])
    pos = np.empty(plan.n_chunks, dtype=np.int64)
    pos[order] = np.arange(plan.n_chunks) - key_start[plan.chunk_key[order]]
    return pos, int(pos.max()) + 1 if plan.n_chunks else 1


def overlaps(r_off: np.ndarray, r_size: np.ndarray, s_off: np.ndarray, s_size: np.ndarray,
             ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (restore piece, saved chunk) that overlap by torch's test, every dimension:
    ``o1 < o2 + s2 and o2 < o1 + s1``. Saved chunks are looked up on dimension 0 by binary
    search (they are sorted by start and, in every layout here, by end too); the other
    dimensions filter the candidates."""
    nr, ns = len(r_off), len(s_off)
    if ndim == 0:
        return np.repeat(np.arange(nr), ns), np.tile(np.arange(ns), nr)
    start, end = s_off[:, 0], s_off[:, 0] + s_size[:, 0]
    srt = np.lexsort((end, start))
    ss, ee = start[srt], end[srt]
    if np.all(np.diff(ee) >= 0):
        a = r_off[:, 0]
        lo = np.searchsorted(ee, a, side="right")
        hi = np.searchsorted(ss, a + r_size[:, 0], side="left")
        count = np.maximum(hi - lo, 0)
        group = np.repeat(np.arange(nr), count)
        ptr = np.concatenate([[0], np.cumsum(count)])
        cand = srt[np.repeat(lo, count) + (np.arange(int(ptr[-1])) - ptr[group])]
    else:  # nested intervals on dimension 0: test every pair (small plans only)
        group, cand = np.repeat(np.arange(nr), ns), np.tile(np.arange(ns), nr)
    keep = np.ones(len(group), dtype=bool)
    for d in range(ndim):
        o1, s1 = r_off[group, d], r_size[group, d]
        o2, s2 = s_off[cand, d], s_size[cand, d]
        keep &= (o1 < o2 + s2) & (o2 < o1 + s1)
    return group[keep], cand[keep]


__all__ = [
    "RESTORE_PLAN_SCHEMA",
    "RestorePlan",
    "build_restore_plan",
    "held_pieces",
    "layout_pieces",
    "overlaps",
    "own_files_plan",
    "restore_pieces",
    "restore_plan_of",
]
