"""torch-dcp's restore as a job restarting on the restore layout loads it.

Every rank of the restore layout is one process: the run's processes host the restore
ranks as the raw format's planned restore places them (``restore_positions``), at most one
each, and those processes form a gloo group of exactly the restore layout's size. Each
allocates its piece of every state-dict key as the restore layout shards it
(:func:`ckptbench.plan.restore.restore_pieces`: its DTensor pieces, empty ones included)
and calls ``torch.distributed.checkpoint.load`` with DCP's default load planner and
reader, so DCP reads what DCP reads: for every piece each overlapping saved chunk, whole;
replicated state by every holder.

Timed: one ``dcp_load`` op per restore rank. Its bytes are the payload of the saved
chunks in DCP's own final load plan (looked up in DCP's ``.metadata``, not in ckptbench's
plan); ``container_bytes`` what DCP read of its files for them (torch.save containers).
Its ``parts`` come from DCP's calls into its reader, in seconds:

metadata  reading and unpickling ``.metadata`` (``read_metadata``)
planning  the local load plans, the coordinator's global plan and its scatter: DCP's
          load-side counterpart of the save's coordinator (up to ``read_data``)
data      reading every item and deserialising it (``torch.load``) into the pieces
sync      waiting for the other ranks to finish (DCP's closing all_gather)

Verified after the clock: each saved chunk read is regenerated, its digest checked
against the manifest's, and its overlap with the piece compared byte for byte.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ckptbench.errors import SpecError
from ckptbench.formats.base import FileJob, everyone, now
from ckptbench.formats.common import NP_DTYPES, ChunkTask, chunk_bytes
from ckptbench.formats.manifest import Digested
from ckptbench.formats.ranged import restore_positions
from ckptbench.formats.verify import describe_difference
from ckptbench.payload import PayloadGenerator
from ckptbench.plan import Plan

PARTS = ("metadata", "planning", "data", "sync")


def check_load_processes(plan: Plan, groups: list[list[int]], shift: int) -> None:
    """Refuse, in one line before anything runs, a restore layout that needs more than one
    DCP rank in some process (DCP loads one rank per process)."""
    ranks = [r for g in groups for r in g]
    world = plan.workload.restore_parallel.world_size
    most = max((len(restore_positions(g, ranks, plan.world_size, world, shift))
                for g in groups), default=0)
    if most > 1:
        raise SpecError(
            f"--format torch-dcp restores with one process per rank of the restore layout "
            f"({world} ranks) and this run has {len(groups)} processes; allowed: a restore "
            f"layout of at most {len(groups)} ranks (--restore-world-size), --format raw, "
            "or --restore-plan files")


def load_group(group: Any, hosting: bool, problem: BaseException | None,
               init: Callable[[], None], made: dict[tuple[int, ...], Any]) -> tuple[Any, bool]:
    """(process group, no_dist) of DCP's load: the processes of the run's `group` hosting
    a rank of the restore layout. Collective: every process calls it, and every one raises
    the first `problem` any had, so none waits for a process that gave up. `init` starts
    the run's torch process group; `made` keeps the groups made, by members."""
    members = everyone(group, (hosting, problem))
    problem = next((p for _, p in members if p is not None), None)
    if problem is not None:
        raise problem
    idx = tuple(p for p, (h, _) in enumerate(members) if h)
    if len(idx) <= 1:
        return None, True  # one DCP rank: no collectives
    init()
    if len(idx) == group.size:
        return None, False
    if idx not in made:
        import torch.distributed as dist

        made[idx] = dist.new_group(ranks=list(idx), backend="gloo")
    return made[idx], False


class TimedReader:
    """Times one ``dcp.load`` by DCP's calls into its storage reader (wrapped in place),
    and counts the bytes of the items its final plan reads."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.marks: dict[str, int] = {}
        self.read_bytes = 0  # payload of the saved chunks read (DCP reads each whole)
        self.container_bytes = 0  # bytes of DCP's files read for them
        self.items = 0
        self._read: tuple[Any, ...] = ()
        for name in ("read_metadata", "read_data"):
            setattr(reader, name, self._timed(name, getattr(reader, name)))

    def _timed(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.marks.setdefault(f"{name}_start", now())
            if name == "read_data":
                self._read = args
            try:
                return fn(*args, **kwargs)
            finally:
                self.marks[f"{name}_end"] = now()
        return timed

    def count(self) -> None:
        """Bytes of the saved chunks DCP's final plan read, from DCP's metadata (after
        the load, off the clock)."""
        if len(self._read) < 2:
            return
        plan, planner = self._read[:2]
        md = planner.metadata.state_dict_metadata
        storage = getattr(self.reader, "storage_data", None) or {}
        sizes: dict[tuple[str, tuple[int, ...]], int] = {}
        for item in plan.items:
            index = item.storage_index
            info = storage.get(index)
            self.container_bytes += int(getattr(info, "length", 0) or 0)
            self.items += 1
            meta = md.get(index.fqn)
            if not hasattr(meta, "chunks"):
                continue  # a non-tensor item: no payload
            key = (index.fqn, tuple(index.offset or ()))
            if key not in sizes:
                itemsize = meta.properties.dtype.itemsize
                for c in meta.chunks:
                    sizes[(index.fqn, tuple(c.offsets))] = math.prod(c.sizes) * itemsize
            self.read_bytes += sizes.get(key, 0)

    def parts(self, t0: int, t1: int) -> dict[str, float]:
        """Seconds of each part of the load that ran from `t0` to `t1` (they add up)."""
        m = self.marks
        meta = m.get("read_metadata_end", t1)
        start = max(meta, m.get("read_data_start", t1))
        end = max(start, m.get("read_data_end", t1))
        bounds = [t0, meta, start, end, max(end, t1)]
        return {p: (bounds[k + 1] - bounds[k]) / 1e9 for k, p in enumerate(PARTS)}


def allocate_pieces(plan: Plan, pieces: list[tuple[int, tuple[int, ...], tuple[int, ...]]]
                    ) -> dict[int, tuple[tuple[int, ...], np.ndarray]]:
    """Key id -> (offsets, an uninitialised array of the piece's shape and dtype)."""
    return {k: (off, np.empty(size, dtype=NP_DTYPES[plan.keys[k].dtype]))
            for k, off, size in pieces}


def _bits(a: np.ndarray) -> np.ndarray:
    """The values as unsigned integers of their size (NaN patterns compare equal)."""
    return a.view(np.dtype(f"<u{a.dtype.itemsize}"))


def _box(lo: list[int], hi: list[int], origin: tuple[int, ...]) -> tuple[Any, ...]:
    """The index of [lo, hi) in an array that starts at `origin` (a 0-d one whole)."""
    return (*(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin, strict=True)), ...)


def verify_pieces(plan: Plan, gen: PayloadGenerator, jobs: list[FileJob],
                  held: dict[int, tuple[tuple[int, ...], np.ndarray]],
                  expected: Mapping[str, Digested], where: str) -> list[str]:
    """Mismatches between the pieces loaded and the saved chunks the jobs read (their
    manifest digests, then every overlap byte for byte)."""
    out: list[str] = []
    for job in jobs:
        at = {int(plan.chunk_file_offset[i]): i for i in plan.chunks_of_file(job.index)}
        for k, read in enumerate(job.reads or []):
            c = plan.chunk(at[read.region.start])
            kid = int(plan.chunk_key[c.index])
            want, d = chunk_bytes(gen, ChunkTask(job, k, kid, c.offsets, c.sizes, c.nbytes),
                                  NP_DTYPES[c.dtype])
            name = f"chunk {c.key} at offsets {list(c.offsets)} ({where})"
            if d != expected[job.name]["digests"][read.digest]:
                out.append(f"{name}: its planned bytes do not match the manifest's digest")
                continue
            off, arr = held[kid]
            lo = [max(a, b) for a, b in zip(off, c.offsets, strict=True)]
            hi = [min(a + n, b + m) for a, n, b, m in zip(off, arr.shape, c.offsets, c.sizes,
                                                          strict=True)]
            if any(a >= b for a, b in zip(lo, hi, strict=True)):
                continue  # an empty piece inside the chunk: read, nothing to compare
            got, exp = arr[_box(lo, hi, off)], want[_box(lo, hi, c.offsets)]
            if not np.array_equal(_bits(got), _bits(exp)):
                out.append(f"{name}: " + describe_difference(
                    np.ascontiguousarray(got).reshape(-1).view(np.uint8),
                    np.ascontiguousarray(exp).reshape(-1).view(np.uint8)))
    return out


__all__ = ["PARTS", "TimedReader", "allocate_pieces", "check_load_processes", "load_group",
           "verify_pieces"]
