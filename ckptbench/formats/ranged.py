"""Restoring as a training stack loads: each rank reads its restore plan's chunks.

A restore plan (:mod:`ckptbench.plan.restore`) gives every rank of the restore layout the
saved chunks it reads, whole, file by file. Here that becomes one :class:`FileJob` per
(rank, file) whose ``reads`` are ranged reads of those chunks, and the raw format's
restore for them (:class:`RangedRestore`): every restoring rank reads the manifest first
(as DCP ranks read ``.metadata``), then a reader thread issues the ranged reads (aligned
for O_DIRECT) into a ring of buffers and a verifier checks each chunk against the digest
recorded when it was saved. Several ranks read one file concurrently where the plan says.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import xxhash

from ckptbench.backends.base import PlannedReads, ReadHandle
from ckptbench.errors import VerificationError
from ckptbench.formats.base import (
    ChunkRead,
    FileJob,
    FormatBase,
    PlannedRestore,
    ThreadResult,
    now,
    round_up,
)
from ckptbench.formats.fill_ins import FillIns, restoring_ranks
from ckptbench.formats.manifest import Manifest
from ckptbench.formats.pipeline import BufferRing, assign_threads
from ckptbench.payload import Region, stream_key
from ckptbench.plan import Plan
from ckptbench.plan.files import RegionLayout, plan_layout
from ckptbench.plan.restore import RestorePlan


def digest_positions(plan: Plan) -> np.ndarray:
    """Each saved chunk's index among its file's non-empty chunks (its manifest digest)."""
    nonempty = (plan.chunk_nbytes > 0).astype(np.int64)
    before = np.concatenate([[0], np.cumsum(nonempty)])
    file_start = np.searchsorted(plan.chunk_file, plan.chunk_file, side="left")
    out: np.ndarray = before[:-1] - before[file_start]
    return out


def restore_jobs(rplan: RestorePlan, ranks: list[int], checkpoint: str, iteration: int,
                 seed: int, fill: FillIns | None = None, fill_in_at: str = "",
                 layout: RegionLayout | None = None) -> list[FileJob]:
    """The jobs of restore ranks `ranks` (one per rank and file, in the plan's order).
    Files that have a fill-in (`fill`: a subset run did not write them) are read from it,
    in the directory `fill_in_at`, at its packed offsets."""
    plan = rplan.save
    layout = layout or plan_layout(plan)
    digests = digest_positions(plan)
    packed: dict[int, dict[int, tuple[int, int]]] = {}
    jobs: list[FileJob] = []
    for r in ranks:
        current: FileJob | None = None
        for i in rplan.reads_of_rank(r).tolist():
            n = int(plan.chunk_nbytes[i])
            if n == 0:
                continue  # an empty saved chunk: DCP reads its container, no payload
            f = int(plan.chunk_file[i])
            filled = fill is not None and f in fill.chunks
            if current is None or current.index != f:
                path = plan.file_paths[f]
                if filled:
                    assert fill is not None
                    packed.setdefault(f, fill.packed(f))
                    current = FileJob(f, int(plan.file_rank[f]), f"{fill_in_at}/{fill.name(f)}",
                                      0, [], stream_key(seed, f, iteration), reads=[], reader=r)
                else:
                    current = FileJob(f, int(plan.file_rank[f]), f"{checkpoint}/{path}", 0, [],
                                      stream_key(seed, f, iteration), int(layout.base[f]),
                                      layout.shared_size.get(path, 0), reads=[], reader=r)
                jobs.append(current)
            key = plan.keys[int(plan.chunk_key[i])]
            start, digest = packed[f][i] if filled else (int(plan.chunk_file_offset[i]),
                                                         int(digests[i]))
            region = Region(start, start + n, key.name, key.dtype)
            current.regions.append(region)
            assert current.reads is not None
            current.reads.append(ChunkRead(region, digest))
            current.size += n
    return jobs


def restore_positions(my_ranks: list[int], all_ranks: list[int], save_world: int,
                      restore_world: int, shift: int) -> list[int]:
    """Restore ranks this process runs. The run's processes (plan-rank positions) share
    the restore layout's ranks in contiguous groups; a subset run restores the ranks of
    the subset that exist in the restore layout. `shift` moves each position's group on
    by that many positions (no process reads back what its node wrote)."""
    ranks = restoring_ranks(all_ranks, save_world, restore_world)
    n = len(all_ranks)
    groups = [g.tolist() for g in np.array_split(np.array(ranks, dtype=np.int64), n)]
    pos = {r: k for k, r in enumerate(all_ranks)}
    return [x for r in my_ranks for x in groups[(pos[r] + shift) % n]]


def by_size(job: FileJob) -> int:
    return job.size


class RangedRestore(FormatBase):
    """The raw format's restore of a restore plan's jobs (mixed into RawFormat)."""

    _held: list[BufferRing] | None = None

    def _locate(self, job: FileJob, region: Region) -> str:  # pragma: no cover - RawFormat's
        raise NotImplementedError

    def restore_planned(self, jobs: list[FileJob], manifest_key: str,
                        planned: PlannedRestore) -> list[ThreadResult]:
        """Every restore rank this process hosts reads the manifest, then the jobs are read
        and verified. The manifest reads are ops (``manifest``, with its size) of each
        rank; the fill-ins' entries complete the manifest's."""
        ranks, fill_ins = planned.ranks, planned.fill_ins
        self._held = None
        nthreads = max(1, self.o.threads) * max(1, len(ranks))
        groups = assign_threads(jobs, nthreads, by_size) if jobs else []
        rings = [BufferRing(max(2, min(self.nbuf, 4)), self.block + 2 * self.align)
                 for _ in groups]
        for ring in rings:
            ring.touch()
        self.backend.warm_reads()
        self.group.barrier()
        heads = [ThreadResult() for _ in ranks]
        manifests: list[Manifest | None] = [None] * len(ranks)

        def read_manifest(k: int) -> None:
            mine = [j for j in jobs if j.reader == ranks[k] and j.name not in fill_ins]
            try:
                manifest, (t0, t1) = self.read_manifest(manifest_key, mine)
                manifests[k] = manifest
                heads[k].op("manifest", -1, 0, t0, t1, {"size": manifest.get("size", 0)},
                            rank=ranks[k])
            except BaseException as exc:
                heads[k].error = exc

        readers = [threading.Thread(target=read_manifest, args=(k,), daemon=True)
                   for k in range(len(ranks))]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        if any(h.error for h in heads) or not jobs:
            return heads
        expected = {**next(m for m in manifests if m is not None)["files"], **fill_ins}
        results = [ThreadResult() for _ in groups]
        threads = []
        for ring, group, res in zip(rings, groups, results, strict=True):
            threads.append(threading.Thread(target=self._read_ranges, args=(ring, group, res),
                                            daemon=True))
            check = self._verify_ranges if self.o.verify else self._drain
            threads.append(threading.Thread(target=check, args=(ring, group, expected, res),
                                            daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._held = rings
        return heads + results

    def _open_planned(self, job: FileJob, res: ThreadResult) -> ReadHandle:
        t0 = now()
        if isinstance(self.backend, PlannedReads):
            handle = self.backend.open_read_planned(
                job.key, [(job.offset + rd.region.start, rd.region.end - rd.region.start)
                          for rd in job.reads or []])
        else:
            handle = self.backend.open_read(job.key)
        res.op("open", job.index, 0, t0, now(), rank=job.reader)
        return handle

    def _read_ranges(self, ring: BufferRing, jobs: list[FileJob], res: ThreadResult) -> None:
        """Read the jobs' chunks in order into `ring`. Where a file's handle reads ahead
        (a store), the next file is opened with it and prefetched after every read: its
        GETs start as the current file's leave room."""
        align = self.align
        ahead: ReadHandle | None = None
        try:
            for j, job in enumerate(jobs):
                handle = ahead or self._open_planned(job, res)
                ahead = None
                if handle.reads_ahead and j + 1 < len(jobs):
                    ahead = self._open_planned(jobs[j + 1], res)
                try:
                    for k, rd in enumerate(job.reads or []):
                        n = rd.region.end - rd.region.start
                        off = 0
                        while off < n:
                            i = ring.take_free()
                            if i is None:
                                return
                            want = min(self.block, n - off)
                            pos = job.offset + rd.region.start + off
                            start = pos // align * align
                            delta = pos - start
                            t0 = now()
                            lent = handle.borrow(pos, want)
                            if lent is not None:  # verified in the store's buffer
                                got, delta = want, 0
                            else:
                                view = memoryview(ring.buffers[i])[:round_up(delta + want, align)]  # type: ignore[arg-type]
                                got = handle.readinto(start, view)
                            t1 = now()
                            res.op("read", job.index, min(max(got - delta, 0), want), t0, t1,
                                   rank=job.reader)
                            if got < delta + want:
                                raise VerificationError(
                                    f"{job.key}: short read at offset {start + got}: chunk "
                                    f"{rd.region.key} needs bytes up to {pos + want} (the file "
                                    "is truncated)")
                            ring.put((j, k, i, delta, want, lent))
                            self.progress(want)
                            off += want
                            if ahead is not None:
                                ahead.prefetch()
                finally:
                    t0 = now()
                    handle.close()
                    res.op("close", job.index, 0, t0, now(), rank=job.reader)
        except BaseException as exc:
            res.error = exc
            ring.stop()
        finally:
            if ahead is not None:
                ahead.close()
            ring.put(None)

    def _drain(self, ring: BufferRing, jobs: list[FileJob], expected: dict[str, Any],
               res: ThreadResult) -> None:
        """Hand each block back unread: restores without verification (a diagnostic of
        the read path's own ceiling; the run records them as unverified)."""
        del jobs, expected, res
        while (item := ring.take()) is not None:
            if item[5] is not None:
                item[5][1]()
            ring.give_back(item[2])

    def _verify_ranges(self, ring: BufferRing, jobs: list[FileJob], expected: dict[str, Any],
                       res: ThreadResult) -> None:
        hashers: dict[tuple[int, int], Any] = {}
        try:
            while True:
                item = ring.take()
                if item is None:
                    break
                j, k, i, delta, n, lent = item
                h = hashers.get((j, k))
                if h is None:
                    h = hashers[(j, k)] = xxhash.xxh3_64()
                if lent is None:
                    h.update(ring.buffers[i][delta:delta + n].data)
                else:
                    view, give_back = lent
                    h.update(view)
                    give_back()
                ring.give_back(i)
            for j, job in enumerate(jobs):
                if res.error is not None:
                    break
                want = expected[job.name]["digests"]
                for k, rd in enumerate(job.reads or []):
                    h = hashers.get((j, k)) or xxhash.xxh3_64()
                    if h.intdigest() != want[rd.digest]:
                        res.mismatches.append(self._locate(job, rd.region))
        except BaseException as exc:
            res.error = res.error or exc
            ring.stop()
