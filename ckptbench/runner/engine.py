"""Executing a plan on a backend: the clock, the threads, the phases, the verification.

Every process runs the same loop over iterations, collectively:

save      prefill payload buffers -> barrier -> T writer threads (open/write/fsync/close
          timed per call; a producer thread per writer generates the bytes off the clock)
          -> gather digests to process 0 -> process 0 commits the manifest atomically
cache     each process evicts its files from the page cache (or O_DIRECT made it moot)
restore   barrier -> every process reads the manifest -> T reader threads (open/read/close
          timed) hand buffers to a verifier thread that checks every chunk's digest
cleanup   process 0 deletes the checkpoint unless --keep

Errors inside a phase are caught on each process and gathered, so the group always
decides together: a failed iteration is removed (no manifest is ever left for it) and
the run stops with the finished iterations' records kept.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import BackendError, CkptbenchError, VerificationError
from ckptbench.payload import ChunkHasher, PayloadGenerator, Region, stream_key
from ckptbench.plan import Plan
from ckptbench.plan.files import RegionLayout, plan_layout
from ckptbench.runner.comm import Comm

MANIFEST_SCHEMA = "ckptbench.manifest/1"
now = time.perf_counter_ns


@dataclass(frozen=True)
class RunOptions:
    iterations: int = 1
    threads: int = 1
    block_size: int = 8 << 20
    payload: str = "random"
    seed: int = 0
    keep: bool = False
    restore: bool = True
    prefill_bytes: int = 64 << 20  # per process: generated before the clock starts
    cache: str = "auto"  # auto: evict after save; none: leave caches alone
    run_id: str = "run"
    restore_shift: int = 0  # read the files of rank (r + shift) % world (IOR -C)
    format: str = "raw"  # raw | zarr | torch-dcp (ckptbench.formats)
    codec: str = "none"  # zarr only: NAME[:k=v,...] (ckptbench.formats.codecs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FileJob:
    """One file of the plan (or one rank's region of a shared file), as a process writes
    or reads it."""

    index: int  # file index in the plan
    rank: int  # plan rank that writes it
    key: str  # backend key (checkpoint dir + file path)
    size: int
    regions: list[Region]  # chunks, relative to `offset`
    base: int  # payload stream key
    offset: int = 0  # where the job's bytes start in the file
    file_size: int = 0  # size of the whole file when several ranks share it, else 0

    @property
    def name(self) -> str:
        """The job's entry in the manifest: the key, or key#rank for a shared file."""
        return f"{self.key}#{self.rank}" if self.file_size else self.key


@dataclass
class ThreadResult:
    # op, file, bytes, t0, t1 [, extra fields for the op record, e.g. {"stored_bytes": n}]
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    digests: dict[int, list[int]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    error: BaseException | None = None


def _aligned_buffer(nbytes: int) -> np.ndarray:
    """Page-aligned memory (mmap), as O_DIRECT needs; np.empty is not aligned. Private:
    Python's default, MAP_SHARED, is shmem, whose pages cost a quarter more to fault in."""
    mm = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE)
    return np.frombuffer(mm, dtype=np.uint8)


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def file_jobs(plan: Plan, ranks: list[int], checkpoint: str, iteration: int, seed: int,
              layout: RegionLayout | None = None) -> list[FileJob]:
    layout = layout or plan_layout(plan)
    jobs = []
    for r in ranks:
        for f in plan.files_of_rank(r):
            path = plan.file_paths[f]
            regions = [Region(c.file_offset, c.file_offset + c.nbytes, c.key, c.dtype)
                       for c in plan.iter_chunks(f) if c.nbytes]
            jobs.append(FileJob(f, r, f"{checkpoint}/{path}",
                                int(plan.file_bytes[f]), regions,
                                stream_key(seed, f, iteration), int(layout.base[f]),
                                layout.shared_size.get(path, 0)))
    return jobs


def manifest_files(plan: Plan, checkpoint: str, digests: dict[int, list[int]],
                   layout: RegionLayout | None = None) -> dict[str, Any]:
    """The manifest's "files": one entry per file, or per rank's region of a shared file
    (named key#rank, with the path, the offset and the whole file's size)."""
    layout = layout or plan_layout(plan)
    out: dict[str, Any] = {}
    for f, d in sorted(digests.items()):
        path, rank = plan.file_paths[f], int(plan.file_rank[f])
        key = f"{checkpoint}/{path}"
        entry: dict[str, Any] = {
            "rank": rank,
            "size": int(plan.file_bytes[f]),
            "chunks": [[c.key, c.file_offset, c.nbytes] for c in plan.iter_chunks(f) if c.nbytes],
            "digests": d,
        }
        if layout.is_shared(path):
            entry.update(path=key, offset=int(layout.base[f]), file_size=layout.shared_size[path])
            key = f"{key}#{rank}"
        out[key] = entry
    return out


def assign_threads(jobs: list[FileJob], threads: int) -> list[list[FileJob]]:
    """Largest file first to the least-loaded thread; each thread keeps plan order."""
    loads = [0] * threads
    out: list[list[FileJob]] = [[] for _ in range(threads)]
    for job in sorted(jobs, key=lambda j: -j.size):
        t = min(range(threads), key=loads.__getitem__)
        out[t].append(job)
        loads[t] += job.size
    for lst in out:
        lst.sort(key=lambda j: j.index)
    return out


class _Pipeline:
    """A bounded ring of aligned buffers between a producer and a consumer thread."""

    def __init__(self, nbuf: int, size: int) -> None:
        self.buffers = [_aligned_buffer(size) for _ in range(nbuf)]
        self.free: queue.Queue[int] = queue.Queue()
        for i in range(nbuf):
            self.free.put(i)
        self.full: queue.Queue[Any] = queue.Queue()
        self.stop = threading.Event()
        self.primed = threading.Event()

    def take_free(self) -> int | None:
        while not self.stop.is_set():
            if self.free.empty():
                self.primed.set()
            try:
                return self.free.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def take_full(self) -> Any:
        while True:
            try:
                return self.full.get(timeout=0.1)
            except queue.Empty:
                if self.stop.is_set():
                    return None


class RankEngine:
    """One process's share of the run: its plan ranks, its threads, its backend."""

    def __init__(self, plan: Plan, ranks: list[int], backend: Backend, comm: Comm,
                 options: RunOptions, progress: Callable[[int], None] | None = None) -> None:
        self.plan = plan
        self.ranks = ranks
        self.backend = backend
        self.comm = comm
        self.o = options
        self.progress = progress or (lambda n: None)
        self.gen = PayloadGenerator(options.payload, options.seed)
        self.align = max(backend.alignment, 1)
        self.block = _round_up(options.block_size, max(self.align, 8))
        # threads and prefill are per plan rank: a process running a group of plan ranks
        # (MPI with fewer processes than ranks) gets each rank's share.
        nthreads = max(1, options.threads) * max(1, len(ranks))
        prefill = options.prefill_bytes * max(1, len(ranks))
        self.share = prefill // nthreads  # payload bytes per thread made before the clock
        self.nbuf = max(2, self.share // self.block)
        self._held: list[_Pipeline] | None = None  # buffers kept until off the clock
        self.nthreads = nthreads

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

    def cache_keys(self, jobs: list[FileJob]) -> list[str]:
        """Backend keys this process wrote for `jobs` (evicted from caches before restore)."""
        return [j.key for j in jobs]

    # --- save ---
    def _produce(self, pipe: _Pipeline, jobs: list[FileJob], res: ThreadResult) -> None:
        try:
            for j, job in enumerate(jobs):
                hasher = ChunkHasher(job.regions)
                if job.size == 0:
                    pipe.full.put((j, 0, None, 0, 0))
                for off in range(0, job.size, self.block):
                    i = pipe.take_free()
                    if i is None:
                        return
                    n = min(self.block, job.size - off)
                    padded = _round_up(n, self.align)
                    buf = pipe.buffers[i]
                    self.gen.fill(job.base, job.regions, off, buf[:_round_up(n, 8)])
                    hasher.update(off, buf[:n])
                    pipe.full.put((j, off, i, n, padded))
                res.digests[job.index] = hasher.digests()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            res.error = exc
            pipe.stop.set()
        finally:
            pipe.primed.set()
            pipe.full.put(None)

    def _write(self, pipe: _Pipeline, jobs: list[FileJob], res: ThreadResult) -> None:
        ops = res.ops
        handle = None
        current = -1

        def finish() -> None:
            assert handle is not None
            t0 = now()
            handle.sync()
            t1 = now()
            handle.close()
            t2 = now()
            ops.append(("fsync", jobs[current].index, 0, t0, t1))
            ops.append(("close", jobs[current].index, 0, t1, t2))

        try:
            while True:
                item = pipe.take_full()
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
                        handle = self.backend.open_write_region(
                            job.key, job.offset, job.size, job.file_size)
                    else:
                        handle = self.backend.open_write(job.key, job.size)
                    ops.append(("open", jobs[j].index, 0, t0, now()))
                if i is None:
                    continue
                view = memoryview(pipe.buffers[i])[:padded]  # type: ignore[arg-type]
                assert handle is not None  # opened at the file's first block
                t0 = now()
                handle.write(view)
                t1 = now()
                ops.append(("write", jobs[j].index, n, t0, t1))
                pipe.free.put(i)
                self.progress(n)
            if handle is not None and res.error is None:
                finish()
                handle = None
        except BaseException as exc:  # noqa: BLE001 - reported to the group
            res.error = res.error or exc
            pipe.stop.set()
            if handle is not None:
                with contextlib.suppress(Exception):  # the first error is the one to report
                    handle.abort()

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]:
        self._held = None  # the last phase's buffers, freed here, before the clock
        groups = assign_threads(jobs, self.nthreads)
        pipes = [_Pipeline(self.buffers_for(g), self.block) for g in groups]
        results = [ThreadResult() for _ in groups]
        producers = [threading.Thread(target=self._produce, args=(p, g, r), daemon=True)
                     for p, g, r in zip(pipes, groups, results, strict=True)]
        for t in producers:
            t.start()
        for p in pipes:  # payload for the first buffers is ready before the clock starts
            p.primed.wait()
        create_error: BaseException | None = None
        if self.comm.rank == 0:  # shared files exist before anyone opens them (off the clock)
            try:
                for key, size in sorted({(j.key, j.file_size) for j in jobs if j.file_size}):
                    self.backend.create_shared(key, size)
            except BaseException as exc:  # noqa: BLE001 - raised after the barrier all take
                create_error = exc
        self.comm.barrier()
        if create_error is not None:
            for p in pipes:
                p.stop.set()
            for t in producers:
                t.join()
            raise create_error
        writers = [threading.Thread(target=self._write, args=(p, g, r), daemon=True)
                   for p, g, r in zip(pipes, groups, results, strict=True)]
        for t in writers:
            t.start()
        for t in writers + producers:
            t.join()
        # Unmapping a large prefill takes long: it happens after the commit, off the clock.
        self._held = pipes
        return results

    # --- restore ---
    def _read(self, pipe: _Pipeline, jobs: list[FileJob], res: ThreadResult) -> None:
        ops = res.ops
        try:
            for j, job in enumerate(jobs):
                t0 = now()
                handle = self.backend.open_read(job.key)
                ops.append(("open", job.index, 0, t0, now()))
                try:
                    off = 0
                    while off < job.size:
                        i = pipe.take_free()
                        if i is None:
                            return
                        want = min(self.block, job.size - off)
                        view = memoryview(pipe.buffers[i])[:_round_up(want, self.align)]  # type: ignore[arg-type]
                        t0 = now()
                        got = handle.readinto(job.offset + off, view)
                        t1 = now()
                        ops.append(("read", job.index, min(got, want), t0, t1))
                        if got < want:
                            raise VerificationError(
                                f"{job.key}: short read at offset {off + got} (file has "
                                f"{off + got} of {job.size} bytes)")
                        pipe.full.put((j, off, i, want))
                        self.progress(want)
                        off += want
                finally:
                    t0 = now()
                    handle.close()
                    ops.append(("close", job.index, 0, t0, now()))
        except BaseException as exc:  # noqa: BLE001 - reported to the group
            res.error = exc
            pipe.stop.set()
        finally:
            pipe.full.put(None)

    def _verify(self, pipe: _Pipeline, jobs: list[FileJob], expected: dict[str, Any],
                res: ThreadResult) -> None:
        hashers: dict[int, ChunkHasher] = {}
        try:
            while True:
                item = pipe.take_full()
                if item is None:
                    break
                j, off, i, n = item
                h = hashers.setdefault(j, ChunkHasher(jobs[j].regions))
                h.update(off, pipe.buffers[i][:n])
                pipe.free.put(i)
            for j, job in enumerate(jobs):
                if res.error is not None:
                    break
                h = hashers.get(j) or ChunkHasher(job.regions)
                want = expected[job.name]["digests"]
                for region, got_d, want_d in zip(job.regions, h.digests(), want, strict=True):
                    if got_d != want_d:
                        res.mismatches.append(self._locate(job, region))
        except BaseException as exc:  # noqa: BLE001
            res.error = res.error or exc
            pipe.stop.set()

    def _locate(self, job: FileJob, region: Region) -> str:
        """Name the chunk, file and first differing byte (re-reads the chunk, off the clock)."""
        n = region.end - region.start
        expected = self.gen.expected(job.base, region)
        start = region.start // self.align * self.align
        buf = _aligned_buffer(_round_up(region.end - start, max(self.align, 1)) + self.align)
        handle = self.backend.open_read(job.key)
        try:
            got = handle.readinto(job.offset + start, memoryview(buf)[:_round_up(region.end - start, self.align)])  # type: ignore[arg-type]
        finally:
            handle.close()
        data = buf[region.start - start:region.start - start + n]
        differ = np.flatnonzero(data[:max(0, got - (region.start - start))] != expected[:got])
        first = int(differ[0]) if len(differ) else min(n, max(0, got - (region.start - start)))
        return (f"chunk {region.key} in {job.key}: bytes differ from offset "
                f"{job.offset + region.start + first} (chunk byte {first} of {n})")

    def read_manifest(self, manifest_key: str, jobs: list[FileJob],
                      fmt: str) -> tuple[dict[str, Any], tuple[int, int]]:
        """Read the commit manifest, timed (it is the restore's first step), and check it
        covers `jobs` and was written in format `fmt`; refuse an uncommitted checkpoint."""
        t0 = now()
        try:
            manifest = json.loads(self.backend.get(manifest_key))
        except FileNotFoundError:
            raise VerificationError(
                f"{manifest_key}: no manifest; the checkpoint is incomplete and is not restored"
            ) from None
        t1 = now()
        written = manifest.get("format", "raw")
        if written != fmt:
            raise VerificationError(f"{manifest_key}: written as {written!r}, not {fmt!r}")
        for job in jobs:
            if job.name not in manifest["files"]:
                raise VerificationError(f"{job.name}: missing from the manifest {manifest_key}")
        return manifest, (t0, t1)

    def restore(self, jobs: list[FileJob], manifest_key: str) -> tuple[list[ThreadResult], tuple[int, int]]:
        # Buffers are allocated and their pages faulted in before the clock starts.
        self._held = None
        groups = assign_threads(jobs, self.nthreads)
        pipes = [_Pipeline(max(2, min(self.nbuf, 4)), self.block) for _ in groups]
        for p in pipes:
            for buf in p.buffers:
                buf[::mmap.PAGESIZE] = 0
        self.comm.barrier()
        manifest, span = self.read_manifest(manifest_key, jobs, "raw")
        expected = manifest["files"]
        results = [ThreadResult() for _ in groups]
        threads = []
        for p, g, r in zip(pipes, groups, results, strict=True):
            threads.append(threading.Thread(target=self._read, args=(p, g, r), daemon=True))
            threads.append(threading.Thread(target=self._verify, args=(p, g, expected, r), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, span


def first_error(results: list[ThreadResult]) -> BaseException | None:
    for r in results:
        if r.error is not None:
            return r.error
    return None


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(kind, one-line message) for an error to be gathered and reported."""
    if isinstance(exc, VerificationError):
        return "verification", str(exc)
    if isinstance(exc, BackendError | CkptbenchError):
        return "backend", str(exc)
    if isinstance(exc, OSError):
        return "backend", f"{getattr(exc, 'filename', '') or ''}: {exc.strerror or exc}".lstrip(": ")
    return "internal", f"{type(exc).__name__}: {exc}"
