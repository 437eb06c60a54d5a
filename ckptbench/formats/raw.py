"""The ``raw`` format (default): the plan's files written byte for byte as planned.

Per I/O thread a producer generates payload into a ring of aligned buffers (off the
clock: the first buffers are filled before the barrier) and a writer times every
open/write/fsync/close. Restore mirrors it: a reader fills the ring, a verifier checks
each chunk's digest (:class:`ckptbench.formats.ranged.RangedRestore`, one engine for a
restore plan's ranged reads and for whole files). Shared files (N-1) are created by
process 0 before the barrier.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ClassVar

import numpy as np

from ckptbench.backends.base import SharedFileWrites, unsupported
from ckptbench.formats.base import (
    FileJob,
    FormatBase,
    GeneratedPayload,
    PayloadSource,
    ThreadResult,
    now,
    round_up,
)
from ckptbench.formats.pipeline import BufferRing, aligned_buffer, assign_threads
from ckptbench.formats.ranged import RangedRestore, by_size
from ckptbench.formats.verify import describe_difference, first_difference
from ckptbench.payload import ChunkHasher, PayloadGenerator, Region


class PlanBytes:
    """One job's bytes as the plan lays them out, made block by block in order (save) or
    checked as they are read (restore). Formats that wrap the plan's bytes in a container
    of their own (torch-save) provide their own, with the same three methods. `source`:
    where the bytes come from (default: generated; a snapshot of a training loop's state
    in ``--mode async``)."""

    def __init__(self, job: FileJob, gen: PayloadGenerator,
                 source: PayloadSource | None = None) -> None:
        self.job, self.gen = job, gen
        self.source = source or GeneratedPayload(gen)
        self.hasher = ChunkHasher(job.regions)

    def fill(self, off: int, buf: np.ndarray, n: int) -> None:
        """The job's bytes [off, off + n) into buf (at least n rounded up to 8 long)."""
        self.source.fill(self.job, off, buf[:round_up(n, 8)])
        self.hasher.update(off, buf[:n])

    def update(self, off: int, data: np.ndarray) -> str | None:
        """Bytes read back at `off`: into the digests (a mismatch shows in digests())."""
        self.hasher.update(off, data)
        return None

    def digests(self) -> list[int]:
        return self.hasher.digests()


class RawFormat(RangedRestore, FormatBase):
    """One process's share of a raw save or restore."""

    name: ClassVar[str] = "raw"
    _held: list[BufferRing] | None = None  # buffers kept until off the clock

    def job_bytes(self, job: FileJob) -> PlanBytes:
        """What makes and checks `job`'s bytes (see PlanBytes)."""
        return PlanBytes(job, self.gen, self.source)

    def buffers_for(self, jobs: list[FileJob]) -> int:
        """Payload buffers for one writer thread. When the thread's whole payload fits its
        share of the prefill, a buffer per block: a small file's only block still takes a
        buffer, but only its bytes are touched and none is reused, so counting buffers
        instead (share // block) would leave payload to be made on the clock. Otherwise
        share // block buffers (at least 2), reused, which bounds the memory."""
        blocks = max(1, sum(-(-j.size // self.block) for j in jobs))
        if sum(j.size for j in jobs) <= self.share:
            return blocks
        return min(blocks, self.nbuf)

    # --- save ---
    def _produce(self, ring: BufferRing, jobs: list[FileJob], res: ThreadResult) -> None:
        try:
            for j, job in enumerate(jobs):
                source = self.job_bytes(job)
                if job.size == 0:
                    ring.put((j, 0, None, 0, 0))
                for off in range(0, job.size, self.block):
                    i = ring.take_free()
                    if i is None:
                        return
                    n = min(self.block, job.size - off)
                    source.fill(off, ring.buffers[i], n)
                    ring.put((j, off, i, n, round_up(n, self.align)))
                res.digests[job.index] = source.digests()
        except BaseException as exc:
            res.error = exc
            ring.stop()
        finally:
            self.source.finish(jobs)
            ring.primed.set()
            ring.put(None)

    def _write(self, ring: BufferRing, jobs: list[FileJob], res: ThreadResult) -> None:
        handle: Any = None
        current = -1

        def finish() -> None:
            t0 = now()
            handle.sync()
            t1 = now()
            handle.close()
            t2 = now()
            res.op("fsync", jobs[current].index, 0, t0, t1)
            res.op("close", jobs[current].index, 0, t1, t2)

        try:
            while True:
                item = ring.take()
                if item is None:
                    break
                j, _off, i, n, padded = item
                if j != current:
                    if handle is not None:
                        finish()
                    current = j
                    job = jobs[j]
                    t0 = now()
                    if job.file_size:
                        handle = self._shared().open_write_region(
                            job.key, job.offset, job.size, job.file_size)
                    else:
                        handle = self.backend.open_write(job.key, job.size)
                    res.op("open", job.index, 0, t0, now())
                if i is None:
                    continue
                view = memoryview(ring.buffers[i])[:padded]
                t0 = now()
                handle.write(view)
                t1 = now()
                res.op("write", jobs[j].index, n, t0, t1)
                ring.give_back(i)
                self.progress(n)
            if handle is not None and res.error is None:
                finish()
                handle = None
        except BaseException as exc:
            res.error = res.error or exc
            ring.stop()
            if handle is not None:
                with contextlib.suppress(Exception):  # the first error is the one to report
                    handle.abort()

    def _shared(self) -> SharedFileWrites:
        """The backend's N-1 writes (a run without them was refused at set-up)."""
        if not isinstance(self.backend, SharedFileWrites):
            raise unsupported(self.backend, "one file written by several ranks")
        return self.backend

    def _create_shared(self, jobs: list[FileJob]) -> BaseException | None:
        """Process 0 creates the shared files before anyone opens them (off the clock)."""
        if self.group.rank != 0:
            return None
        try:
            for key, size in sorted({(j.key, j.file_size) for j in jobs if j.file_size}):
                self._shared().create_shared(key, size)
        except BaseException as exc:
            return exc
        return None

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        self._held = None  # the last phase's buffers, freed here, before the clock
        groups = assign_threads(jobs, self.nthreads, by_size)
        rings = [BufferRing(self.buffers_for(g), self.block) for g in groups]
        results = [ThreadResult() for _ in groups]
        producers = [threading.Thread(target=self._produce, args=(r, g, res), daemon=True)
                     for r, g, res in zip(rings, groups, results, strict=True)]
        self.source.expect(groups, self.block)
        for t in producers:
            t.start()
        if self.source.prefill:  # the first buffers' payload is ready before the clock starts
            for r in rings:
                r.primed.wait()
        create_error = self._create_shared(jobs)
        self.group.barrier()
        if create_error is not None:
            for r in rings:
                r.stop()
            for t in producers:
                t.join()
            raise create_error
        writers = [threading.Thread(target=self._write, args=(r, g, res), daemon=True)
                   for r, g, res in zip(rings, groups, results, strict=True)]
        for t in writers:
            t.start()
        for t in writers + producers:
            t.join()
        # Unmapping a large prefill takes long: it happens after the commit, off the clock.
        self._held = rings
        return results

    # --- restore (the engine: formats.ranged.RangedRestore) ---
    def _locate(self, job: FileJob, region: Region) -> str:
        """Name the chunk, file and first differing byte (re-reads the chunk, off the clock);
        or say the bytes are intact and it is the recorded digest that differs."""
        n = region.end - region.start
        expected = self.gen.expected(job.base, region)
        start = region.start // self.align * self.align
        span = round_up(region.end - start, self.align)
        buf = aligned_buffer(span + self.align)
        handle = self.backend.open_read(job.key)
        try:
            got = handle.readinto(job.offset + start, buf.data[:span])
        finally:
            handle.close()
        lead = region.start - start
        data = buf[lead:lead + max(0, min(n, got - lead))]
        where = f"chunk {region.key} in {job.key}"
        first = first_difference(data, expected)
        if first is not None and first < len(data):
            return (f"{where}: bytes differ from offset {job.offset + region.start + first} "
                    f"(chunk byte {first} of {n})")
        return f"{where}: {describe_difference(data, expected)}"
