"""What the non-raw formats share: chunks as tasks, their bytes, and the plan checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.formats.base import FileJob
from ckptbench.payload import PayloadGenerator, digest
from ckptbench.plan import Plan
from ckptbench.plan.sharding import MAX_DIMS

# bfloat16 travels as its 2-byte pattern (numpy has no bfloat16); formats record the truth.
NP_DTYPES: dict[str, np.dtype[Any]] = {
    "bfloat16": np.dtype("<u2"), "float16": np.dtype("<f2"), "float32": np.dtype("<f4")}


@dataclass(frozen=True)
class ChunkTask:
    """One non-empty chunk of a job (a plan file, as a process writes or reads it)."""

    job: FileJob
    region: int  # index of the chunk among the job's regions (= its digest's index)
    key: int  # index into plan.keys
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    nbytes: int


def chunk_tasks(plan: Plan, jobs: list[FileJob]) -> list[ChunkTask]:
    tasks = []
    for job in jobs:
        region = 0
        for i in plan.chunks_of_file(job.index):
            c = plan.chunk(i)
            if not c.nbytes:
                continue
            tasks.append(ChunkTask(job, region, int(plan.chunk_key[i]), c.offsets, c.sizes, c.nbytes))
            region += 1
    return tasks


def checkpoint_of(plan: Plan, jobs: list[FileJob], fmt: str) -> str:
    """The checkpoint directory (key prefix) the jobs belong to."""
    if not jobs:
        raise CkptbenchError(f"--format {fmt}: a process without chunks cannot place the"
                             " checkpoint; allowed: plans where every process writes")
    job = jobs[0]
    return job.key[: len(job.key) - len(plan.file_paths[job.index]) - 1]


def chunk_bytes(gen: PayloadGenerator, task: ChunkTask, dtype: np.dtype[Any],
                buf: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """The chunk's bytes, exactly those the raw format writes for it (same stream key,
    same offsets in its file), as an array of the chunk's shape; and their digest."""
    r = task.job.regions[task.region]
    start8 = r.start // 8 * 8
    delta = r.start - start8
    size = (delta + task.nbytes + 7) // 8 * 8
    buf = np.empty(size, dtype=np.uint8) if buf is None else buf[:size]
    gen.fill(task.job.base, [r], start8, buf)
    raw = buf[delta:delta + task.nbytes]
    if delta % dtype.itemsize:
        raw = raw.copy()
    return raw.view(dtype).reshape(task.sizes), digest(raw)


def check_tiling(plan: Plan, fmt: str) -> None:
    """Each key's non-empty chunks must tile its global tensor exactly (global arrays)."""
    nz = plan.chunk_nbytes > 0
    kid = plan.chunk_key[nz].astype(np.int64)
    sizes = plan.chunk_sizes[nz]
    ndims = np.array([len(k.global_shape) for k in plan.keys], dtype=np.int64)
    dims = np.arange(MAX_DIMS)[None, :] < ndims[kid][:, None]
    numel = np.prod(np.where(dims, sizes, 1), axis=1).astype(np.float64)
    covered = np.bincount(kid, weights=numel, minlength=len(plan.keys))
    want = np.array([math.prod(k.global_shape) for k in plan.keys], dtype=np.float64)
    bad = np.flatnonzero(covered != want)
    if len(bad):
        key = plan.keys[int(bad[0])]
        how = "overlap" if covered[bad[0]] > want[bad[0]] else "leave gaps in"
        raise SpecError(
            f"--format {fmt} needs chunks that tile each tensor exactly; the chunks of "
            f"{key.name!r} {how} its global shape {key.global_shape} (layout "
            f"{plan.workload.parallel.layout!r}); allowed: --format raw")
