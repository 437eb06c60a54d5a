"""Fill-ins: the saved chunks a subset run's restoring ranks read but the subset did not
write, as files written before its restore (the runner writes and removes them:
runner.fill_in).

A run of some of the plan's ranks saves only their files, but with the DCP restore plan
its restoring ranks read every saved chunk that overlaps what they hold in the restore
layout, whichever rank wrote it: TP-replicated and deduplicated state (``step`` scalars,
norms), replicas, resharded pieces. Whole files would be far more than those reads (a
rank reading one 4-byte ``step`` from each of a thousand files), so each file is stood in
for by its *fill-in*: the chunks the restoring ranks read from it, each whole, packed in
file order, with the payload rules of every file (the file's stream key). The restore
reads them in the plan's order and sizes, from the fill-in's offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ckptbench.formats.base import FileJob
from ckptbench.payload import Region, stream_key
from ckptbench.plan import Plan
from ckptbench.plan.restore import RestorePlan, restore_plan_of
from ckptbench.plan.restore_ranks import restoring_ranks


@dataclass(frozen=True)
class FillIns:
    """The fill-ins of one run: per file the subset did not write, the saved chunks its
    restoring ranks read there, in file order."""

    plan: Plan
    chunks: dict[int, tuple[int, ...]]  # file -> its chunks read (saved chunk indices)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    @property
    def files(self) -> list[int]:
        return sorted(self.chunks)

    @cached_property
    def _shared(self) -> set[str]:
        """Paths of which more than one file (a rank's region of a shared file) is here."""
        seen: set[str] = set()
        twice: set[str] = set()
        for f in self.chunks:
            path = self.plan.file_paths[f]
            (twice if path in seen else seen).add(path)
        return twice

    def name(self, f: int) -> str:
        """The fill-in's name in its directory: the file's path (a rank's region of a
        shared file gets a file of its own: path.RANK)."""
        path = self.plan.file_paths[f]
        return f"{path}.{int(self.plan.file_rank[f])}" if path in self._shared else path

    def names(self) -> list[str]:
        return [self.name(f) for f in self.files]

    def packed(self, f: int) -> dict[int, tuple[int, int]]:
        """chunk -> (offset in the fill-in, position among its regions: its digest)."""
        sizes = self.plan.chunk_nbytes[list(self.chunks[f])]
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        return {c: (int(s), k) for k, (c, s) in enumerate(zip(self.chunks[f], starts.tolist(),
                                                                  strict=True))}

    def nbytes(self, f: int) -> int:
        return int(self.plan.chunk_nbytes[list(self.chunks[f])].sum())

    @property
    def total_bytes(self) -> int:
        return sum(self.nbytes(f) for f in self.chunks)

    def jobs(self, where: str, iteration: int, seed: int) -> list[FileJob]:
        """The writes of every fill-in into the directory `where`."""
        plan, out = self.plan, []
        for f in self.files:
            regions = []
            for c, (start, _) in self.packed(f).items():
                key = plan.keys[int(plan.chunk_key[c])]
                regions.append(Region(start, start + int(plan.chunk_nbytes[c]), key.name,
                                      key.dtype))
            out.append(FileJob(f, int(plan.file_rank[f]), f"{where}/{self.name(f)}",
                               self.nbytes(f), regions, stream_key(seed, f, iteration)))
        return out


def fill_ins_of(rplan: RestorePlan, all_ranks: list[int]) -> FillIns:
    """The fill-ins a run of plan ranks `all_ranks` needs (none for a run of every rank)."""
    plan = rplan.save
    if len(all_ranks) == plan.world_size:
        return FillIns(plan, {})
    ranks = restoring_ranks(all_ranks, plan.world_size, rplan.world_size)
    if not ranks:
        return FillIns(plan, {})
    reads = np.unique(np.concatenate([rplan.reads_of_rank(r) for r in ranks]))
    reads = reads[plan.chunk_nbytes[reads] > 0]
    outside = ~np.isin(plan.file_rank[plan.chunk_file[reads]], np.asarray(all_ranks))
    reads = reads[outside]
    # chunks are stored by (file, offset): sorted indices are in file order
    files = plan.chunk_file[reads].astype(np.int64)
    bounds = np.flatnonzero(np.diff(files)) + 1
    return FillIns(plan, {int(files[g[0]]): tuple(int(c) for c in reads[g])
                          for g in np.split(np.arange(len(reads)), bounds) if len(g)})


def fill_in_dir(plan: Plan, iteration: int) -> str:
    """The directory, beside the run's checkpoints, where the fill-ins of iteration
    `iteration`'s restore are written (never the checkpoint a restore reads)."""
    return f"{plan.checkpoint_name(iteration)}-fill-in"


def fill_in_names(plan: Plan, groups: list[list[int]]) -> list[str]:
    """The names of the fill-ins a run of plan ranks `groups` (one list per process)
    writes in each fill-in directory with the DCP restore plan (for its cleanup)."""
    all_ranks = sorted({r for g in groups for r in g})
    if len(all_ranks) == plan.world_size:
        return []
    return fill_ins_of(restore_plan_of(plan), all_ranks).names()


__all__ = ["FillIns", "fill_in_dir", "fill_in_names", "fill_ins_of"]
