"""The raw format's restore: each rank reads its restore plan's chunks, or its whole files.

A restore plan (:mod:`ckptbench.plan.restore`) gives every rank of the restore layout the
saved chunks it reads, whole, file by file. Here that becomes one :class:`FileJob` per
(rank, file) whose ``reads`` are ranged reads of those chunks, and the raw format's
restore for them (:class:`RangedRestore`): every restoring rank reads the manifest first
(as DCP ranks read ``.metadata``), then a reader thread issues the ranged reads (aligned
for O_DIRECT) into a ring of buffers and a verifier checks each chunk against the digest
recorded when it was saved. Several ranks read one file concurrently where the plan says.
A restore of whole files (``--restore-plan files``) is the same engine with one span per
file.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from ckptbench.backends.base import PlannedReads, ReadHandle, TransferBuffers
from ckptbench.errors import VerificationError
from ckptbench.formats.base import (
    ChunkRead,
    FileJob,
    FormatBase,
    PlannedRestore,
    Restored,
    ThreadResult,
    now,
    round_up,
)
from ckptbench.formats.fill_ins import FillIns
from ckptbench.formats.manifest import Digested, Manifest
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


def by_size(job: FileJob) -> int:
    return job.size


class ChunkCheck(Protocol):
    """What checks one job's bytes as they arrive (the raw format's PlanBytes; torch-save's
    checks its container's own bytes too)."""

    def update(self, off: int, data: np.ndarray) -> str | None:
        """Bytes read at `off` of the job: into the chunks' digests; where bytes that are
        not a chunk's differ, say so."""

    def digests(self) -> list[int]:
        """Each of the job's chunks' digest (job.regions' order)."""


WHOLE_FILE = ""  # the key of a whole file's one span (a chunk's span has the chunk's key)


def spans_of(job: FileJob) -> list[Region]:
    """What the restore reads of `job`, in order, relative to its offset: a restore
    plan's job, each chunk it reads; a whole file, one span of all of it."""
    if job.reads is not None:
        return [rd.region for rd in job.reads]
    return [Region(0, job.size, WHOLE_FILE, "")] if job.size else []


class RangedRestore(FormatBase):
    """The raw format's restore engine (mixed into RawFormat), one for both plans: every
    job is a list of spans (:func:`spans_of`) that a reader thread reads in order, in
    blocks, into a ring of aligned buffers, and a verifier checks chunk by chunk as the
    blocks arrive. A restore plan's job reads its chunks (DCP's load); a whole file is a
    ranged read with one span (``--restore-plan files``, as fio reads a file)."""

    _held: list[BufferRing] | None = None

    def job_bytes(self, job: FileJob) -> ChunkCheck:  # pragma: no cover - RawFormat's
        raise NotImplementedError

    def _locate(self, job: FileJob, region: Region) -> str:  # pragma: no cover - RawFormat's
        raise NotImplementedError

    def restore(self, jobs: list[FileJob], manifest_key: str,
                planned: PlannedRestore | None = None) -> Restored:
        """Buffers made and faulted in, then the barrier (the clock), the manifest read and
        the jobs read and verified. Restoring whole files, the manifest read is the phase's
        first step; by a restore plan, every restore rank this process hosts reads it (an
        op of that rank's, ``manifest`` with its size) and the fill-ins' entries complete
        it."""
        ranks = self.ranks if planned is None else planned.ranks
        self._held = None
        nthreads = max(1, self.o.threads) * max(1, len(ranks))
        groups = assign_threads(jobs, nthreads, by_size) if jobs else []
        rings = [BufferRing(max(2, min(self.nbuf, 4)), self.block + 2 * self.align)
                 for _ in groups]
        for ring in rings:
            ring.touch()
        if isinstance(self.backend, TransferBuffers):
            self.backend.warm_reads()
        self.group.barrier()
        if planned is None:
            manifest, span = self.read_manifest(manifest_key, jobs)
            heads: list[ThreadResult] = []
            expected: Mapping[str, Digested] | None = manifest.files
        else:
            span = None
            heads, expected = self._read_manifests(jobs, manifest_key, planned)
        if expected is None or not jobs:
            return Restored(heads, span)
        results = [ThreadResult() for _ in groups]
        threads = []
        for ring, group, res in zip(rings, groups, results, strict=True):
            threads.append(threading.Thread(target=self._read_spans, args=(ring, group, res),
                                            daemon=True))
            check = self._verify if self.o.verify else self._drain
            threads.append(threading.Thread(target=check, args=(ring, group, expected, res),
                                            daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._held = rings
        return Restored(heads + results, span)

    def _read_manifests(self, jobs: list[FileJob], manifest_key: str, planned: PlannedRestore
                        ) -> tuple[list[ThreadResult], dict[str, Any] | None]:
        """Each restore rank's manifest read, at once (one thread each); the entries of the
        files the jobs read (None when a read failed: the heads hold the error)."""
        ranks, fill_ins = planned.ranks, planned.fill_ins
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
            return heads, None
        return heads, {**next(m for m in manifests if m is not None)["files"], **fill_ins}

    def _open(self, job: FileJob, res: ThreadResult) -> ReadHandle:
        """A restore plan's job opens with its spans where the backend fetches planned reads
        ahead; a whole file opens plainly (a backend's own sequential read-ahead serves it)."""
        t0 = now()
        if job.reads is not None and isinstance(self.backend, PlannedReads):
            handle = self.backend.open_read_planned(
                job.key, [(job.offset + r.start, r.end - r.start) for r in spans_of(job)])
        else:
            handle = self.backend.open_read(job.key)
        res.op("open", job.index, 0, t0, now(), rank=job.reader)
        return handle

    def _read_spans(self, ring: BufferRing, jobs: list[FileJob], res: ThreadResult) -> None:
        """Read the jobs' spans in order into `ring`, a block at most per buffer (aligned
        for O_DIRECT: a block's bytes start `delta` into its buffer). Where a file's handle
        reads ahead (a store), the next file is opened with it and prefetched after every
        read: its GETs start as the current file's leave room. A block that the handle
        holds in memory of its own is lent, verified there and given back (no copy)."""
        align = self.align
        ahead: ReadHandle | None = None
        try:
            for j, job in enumerate(jobs):
                handle = ahead or self._open(job, res)
                ahead = None
                if handle.reads_ahead and j + 1 < len(jobs):
                    ahead = self._open(jobs[j + 1], res)
                try:
                    for span in spans_of(job):
                        at = span.start
                        while at < span.end:
                            i = ring.take_free()
                            if i is None:
                                return
                            want = min(self.block, span.end - at)
                            pos = job.offset + at
                            start = pos // align * align
                            delta = pos - start
                            t0 = now()
                            lent = handle.borrow(pos, want)
                            if lent is not None:
                                got, delta = want, 0
                            else:
                                view = ring.buffers[i].data[:round_up(delta + want, align)]
                                got = handle.readinto(start, view)
                            t1 = now()
                            res.op("read", job.index, min(max(got - delta, 0), want), t0, t1,
                                   rank=job.reader)
                            if got < delta + want:
                                raise _short_read(job, span, start + got, pos + want)
                            ring.put((j, at, i, delta, want, lent))
                            self.progress(want)
                            at += want
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

    def _drain(self, ring: BufferRing, jobs: list[FileJob], expected: Mapping[str, Digested],
               res: ThreadResult) -> None:
        """Hand each block back unread: restores without verification (a diagnostic of
        the read path's own ceiling; the run records them as unverified)."""
        del jobs, expected, res
        while (item := ring.take()) is not None:
            if item[5] is not None:
                item[5][1]()
            ring.give_back(item[2])

    def _verify(self, ring: BufferRing, jobs: list[FileJob], expected: Mapping[str, Digested],
                res: ThreadResult) -> None:
        """Feed each block to its job's check as it arrives; at the end, compare each chunk's
        digest with its manifest entry's (a chunk a restore plan reads names its place
        there) and locate every mismatch."""
        checks: dict[int, ChunkCheck] = {}
        try:
            while (item := ring.take()) is not None:
                j, at, i, delta, n, lent = item
                check = checks.get(j)
                if check is None:
                    check = checks[j] = self.job_bytes(jobs[j])
                try:
                    data = (ring.buffers[i][delta:delta + n] if lent is None
                            else np.frombuffer(lent[0], dtype=np.uint8))
                    bad = check.update(at, data)
                finally:
                    if lent is not None:
                        lent[1]()
                    ring.give_back(i)
                if bad:
                    res.mismatches.append(bad)
            for j, job in enumerate(jobs):
                if res.error is not None:
                    break
                got = (checks.get(j) or self.job_bytes(job)).digests()
                want = expected[job.name]["digests"]
                places = (range(len(job.regions)) if job.reads is None
                          else [rd.digest for rd in job.reads])
                for region, digest, k in zip(job.regions, got, places, strict=True):
                    if digest != want[k]:
                        res.mismatches.append(self._locate(job, region))
        except BaseException as exc:
            res.error = res.error or exc
            ring.stop()


def _short_read(job: FileJob, span: Region, reached: int, needed: int) -> VerificationError:
    what = "the file" if span.key == WHOLE_FILE else f"chunk {span.key}"
    return VerificationError(f"{job.key}: short read at offset {reached}: {what} needs bytes "
                             f"up to {needed} (the file is truncated)")
