"""The seam between the runner and a checkpoint format.

A format turns one process's share of a plan (its :class:`FileJob` list) into bytes on a
backend and back. The runner owns everything around it: the iteration loop, the manifest
commit, cache eviction, records and the decision whether an iteration failed. A format only
needs the processes running the save together (a :class:`Group`: barrier, gather, bcast),
which the runner's Comm satisfies structurally; formats never import the runner.

Contract of every format (the :class:`Format` protocol):

* ``save(jobs)``: make the first payload ready, call ``group.barrier()`` (the clock starts
  there for every process), write every job durably, return per-thread results (timed ops,
  each chunk's digest, the first error);
* ``restore(jobs, manifest_key, planned)``: ``group.barrier()``, read the manifest (timed:
  it is the restore's first step), read every job back and check each chunk against its
  digest; `planned` (a restore by the plan's restore layout): the jobs are ranged reads;
* ``cache_keys(jobs)``: the backend keys this process wrote (evicted before a restore);
* ``written_names(plan, groups, options)`` (a classmethod): the names, relative to a
  checkpoint directory, of everything all the run's processes write in one checkpoint;
  the runner records them before the first write and deletes by them (never by listing).

Where the bytes come from is a seam of its own (:class:`PayloadSource`): generated on the
fly by default, or copied from a snapshot of a training loop's state (asynchronous
checkpoints, ``ckptbench.runner.staging``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import SpecError, VerificationError
from ckptbench.formats.codecs import CodecSpec
from ckptbench.formats.manifest import Digested, Manifest, read_manifest_bytes
from ckptbench.payload import PayloadGenerator, Region, stream_key
from ckptbench.plan import Plan
from ckptbench.plan.files import RegionLayout, plan_layout

now = time.perf_counter_ns

T = TypeVar("T")  # what a collective carries: a gather returns a list of it


class Group(Protocol):
    """The processes saving one checkpoint together (rank 0 coordinates)."""

    rank: int
    size: int

    def barrier(self) -> None: ...

    def gather(self, obj: T) -> list[T] | None: ...

    def bcast(self, obj: T) -> T: ...

    def host(self) -> str: ...


def from_root(group: Group, obj: T | None) -> T:
    """Process 0's `obj` on every process (the others pass None: they hold none)."""
    out = group.bcast(obj)
    if out is None:
        raise RuntimeError("process 0 sent nothing to a collective that needs its value")
    return out


def everyone(group: Group, obj: T) -> list[T]:
    """Every process's `obj`, in rank order, on every process (a gather sent on by 0)."""
    return from_root(group, group.gather(obj))


@dataclass(frozen=True)
class FormatOptions:
    """What a format needs of the run's options (per plan rank)."""

    threads: int = 1
    block_size: int = 8 << 20
    payload: str = "random"
    seed: int = 0
    prefill_bytes: int = 64 << 20  # payload generated before the clock starts
    codec: str = "none"
    verify: bool = True  # False: restored bytes are read and dropped (a diagnostic)


@dataclass(frozen=True)
class ChunkRead:
    """One saved chunk a restoring rank reads whole (a ranged read), and where its digest
    sits in its file's manifest entry."""

    region: Region  # the chunk's bytes, relative to the job's offset
    digest: int  # index into the file's manifest "digests"


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
    # A restore plan's job: the chunks `reader` reads from this file (`rank` wrote it),
    # in order; None for a job that reads or writes the whole file.
    reads: list[ChunkRead] | None = None
    reader: int = -1

    @property
    def name(self) -> str:
        """The job's entry in the manifest: the key, or key#rank for a shared file."""
        return f"{self.key}#{self.rank}" if self.file_size else self.key


@dataclass(frozen=True)
class TimedOp:
    """One timed call of a format: op, plan file index, bytes, start/end (ns), extra fields
    for its record (e.g. stored_bytes, object)."""

    op: str
    file: int
    nbytes: int
    start_ns: int
    end_ns: int
    extra: dict[str, Any] | None = None
    rank: int = -1  # the plan rank it was for, when not the file's writer (restore plans)


@dataclass
class ThreadResult:
    """What one I/O thread of a format did in one phase."""

    ops: list[TimedOp] = field(default_factory=list)
    digests: dict[int, list[int]] = field(default_factory=dict)  # file index -> chunk digests
    # metadata objects written (name relative to the checkpoint -> digest), for the manifest
    objects: dict[str, int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def op(self, op: str, file: int, nbytes: int, start_ns: int, end_ns: int,
           extra: dict[str, Any] | None = None, rank: int = -1) -> None:
        self.ops.append(TimedOp(op, file, nbytes, start_ns, end_ns, extra, rank))


def first_error(results: list[ThreadResult]) -> BaseException | None:
    return next((r.error for r in results if r.error is not None), None)


class PayloadSource(Protocol):
    """Where a format's writer threads get a file's bytes.

    ``prefill``: the source may be drained ahead of the clock (generated payload); a
    snapshot is already in memory and is never waited for before writing starts.
    ``expect``: the format announces, before its threads start, which jobs each thread
    takes and in what block size, in order (a bounded snapshot stages them in that order).
    ``fill``: bytes [offset, offset + len(out)) of the job into `out` (past the job's end:
    zeros). ``finish``: a thread is done with its jobs (also when it stopped early).
    """

    prefill: bool

    def expect(self, threads: list[list[FileJob]], block: int) -> None: ...

    def fill(self, job: FileJob, offset: int, out: np.ndarray) -> None: ...

    def finish(self, jobs: list[FileJob]) -> None: ...


class GeneratedPayload:
    """The default source: the deterministic payload, generated as it is asked for."""

    prefill = True

    def __init__(self, gen: PayloadGenerator) -> None:
        self.gen = gen

    def expect(self, threads: list[list[FileJob]], block: int) -> None:
        return None

    def fill(self, job: FileJob, offset: int, out: np.ndarray) -> None:
        self.gen.fill(job.base, job.regions, offset, out)

    def finish(self, jobs: list[FileJob]) -> None:
        return None


@dataclass(frozen=True)
class PlannedRestore:
    """A restore by the plan's restore layout (DCP's load planner), as one process runs
    it: the restore ranks it hosts (jobs' ``reads`` say which saved chunks each reads) and
    the manifest entries (digests) of files written as fill-ins, which the checkpoint's
    manifest does not list."""

    ranks: list[int]
    fill_ins: dict[str, Digested] = field(default_factory=dict)


@dataclass
class Restored:
    """What a restore did: per-thread results; `manifest`, the one timed manifest read of
    a restore of whole files (a planned restore times each rank's read as an op)."""

    results: list[ThreadResult]
    manifest: tuple[int, int] | None = None


Progress = Callable[[int], None]


class Format(Protocol):
    """What the runner asks of a format (see the module docstring): everything the runner
    calls is declared here, nothing is probed."""

    name: ClassVar[str]
    # progress(n) is called as bytes move (each block or chunk): the runner can watch for
    # stalls; False when a format only learns of its bytes once a whole phase is done
    streams_progress: ClassVar[bool]
    # the bytes move through a library's own storage layer (DCP's writer and reader), not
    # the backend's handles: the backend serves the target's control requests only
    own_storage: ClassVar[bool]
    # the library commits the checkpoint itself (DCP's save returns once its .metadata is
    # written): ckptbench's own manifest, kept for its restores' checks, is off the clock
    commits_itself: ClassVar[bool]
    gen: PayloadGenerator  # the deterministic payload (what a restore checks against)
    source: PayloadSource  # where the save's bytes come from (a snapshot in async mode)
    progress: Progress  # called as bytes move (the fill-ins' save swaps in a quiet one)

    def __init__(self, plan: Plan, ranks: list[int], backend: Backend, group: Group,
                 options: FormatOptions, progress: Progress | None = None) -> None: ...

    def save(self, jobs: list[FileJob]) -> list[ThreadResult]: ...

    def restore(self, jobs: list[FileJob], manifest_key: str,
                planned: PlannedRestore | None = None) -> Restored:
        """``group.barrier()``, read the manifest, read every job back and check each chunk
        against its digest; `planned`: the jobs are a restore plan's ranged reads."""
        ...

    def cache_keys(self, jobs: list[FileJob]) -> list[str]: ...

    @classmethod
    def written_names(cls, plan: Plan, groups: list[list[int]],
                      options: FormatOptions) -> list[str]: ...

    @classmethod
    def memory_bytes(cls, plan: Plan, ranks: list[int], options: FormatOptions,
                     alignment: int) -> int: ...

    @classmethod
    def check(cls, plan: Plan, ranks: list[int], codec: CodecSpec) -> None: ...

    @classmethod
    def check_restore(cls, plan: Plan, groups: list[list[int]], shift: int) -> None: ...


def _no_progress(n: int) -> None:
    del n


def round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


THREAD_BYTES = 256 << 10  # what a Python thread costs, about (stack pages, its state)


@dataclass(frozen=True)
class Sizing:
    """How one process sizes its I/O: the block rounded to the backend's alignment, and
    threads and prefill per plan rank (a process running a group of plan ranks, MPI with
    fewer processes than ranks, gets each rank's share)."""

    align: int
    block: int
    nthreads: int
    share: int  # payload bytes per thread made before the clock
    nbuf: int  # buffers of a thread's ring when the prefill bounds it

    @classmethod
    def of(cls, options: FormatOptions, nranks: int, alignment: int) -> Sizing:
        align = max(alignment, 1)
        block = round_up(options.block_size, max(align, 8))
        nthreads = max(1, options.threads) * max(1, nranks)
        share = options.prefill_bytes * max(1, nranks) // nthreads
        return cls(align, block, nthreads, share, max(2, share // block))


class FormatBase:
    """What every format derives from the same inputs: the payload generator, the block
    size rounded to the backend's alignment, threads and prefill per process; and the
    restore entry point, which hands a planned restore to :meth:`restore_planned` and a
    restore of whole files to :meth:`restore_files`."""

    name: ClassVar[str] = "?"
    streams_progress: ClassVar[bool] = True  # Format says what these mean
    own_storage: ClassVar[bool] = False
    commits_itself: ClassVar[bool] = False

    def __init__(self, plan: Plan, ranks: list[int], backend: Backend, group: Group,
                 options: FormatOptions, progress: Progress | None = None) -> None:
        self.plan = plan
        self.ranks = ranks
        self.backend = backend
        self.group = group
        self.o = options
        self.progress: Progress = progress or _no_progress
        self.gen = PayloadGenerator(options.payload, options.seed)
        self.source: PayloadSource = GeneratedPayload(self.gen)  # replaced for snapshots
        size = Sizing.of(options, len(ranks), backend.alignment)
        self.align, self.block, self.nthreads = size.align, size.block, size.nthreads
        self.share, self.nbuf = size.share, size.nbuf

    @classmethod
    def memory_bytes(cls, plan: Plan, ranks: list[int], options: FormatOptions,
                     alignment: int) -> int:
        """About the most memory one process running plan ranks `ranks` takes: the save's
        payload buffers (the prefill, at least two blocks per thread), the restore's read
        ring (two to four blocks per thread, faulted in before the clock), thread stacks.
        The runner refuses a run whose processes on one host would not fit its memory."""
        size = Sizing.of(options, len(ranks), alignment)
        save = max(size.share, 2 * size.block) * size.nthreads
        restore = max(2, min(size.nbuf, 4)) * size.block * size.nthreads
        return max(save, restore) + 2 * size.nthreads * THREAD_BYTES

    @classmethod
    def check(cls, plan: Plan, ranks: list[int], codec: CodecSpec) -> None:
        """Refuse, in one line before anything runs, a plan or codec this format cannot
        write. By default: uncompressed bytes only."""
        if codec != CodecSpec():
            raise SpecError(f"--codec {codec.name!r} needs --format zarr (--format {cls.name} "
                            "writes uncompressed bytes); allowed here: --codec none")

    @classmethod
    def check_restore(cls, plan: Plan, groups: list[list[int]], shift: int) -> None:
        """Refuse, in one line before anything runs, a planned restore (the plan's restore
        layout) that the processes running plan ranks `groups` cannot run. By default any."""
        del plan, groups, shift

    def restore(self, jobs: list[FileJob], manifest_key: str,
                planned: PlannedRestore | None = None) -> Restored:
        if planned is None:
            results, span = self.restore_files(jobs, manifest_key)
            return Restored(results, span)
        return Restored(self.restore_planned(jobs, manifest_key, planned))

    def restore_files(self, jobs: list[FileJob], manifest_key: str
                      ) -> tuple[list[ThreadResult], tuple[int, int]]:
        """Read whole files back and verify them; the manifest read's clock readings."""
        raise NotImplementedError(f"--format {self.name}: no restore")

    def restore_planned(self, jobs: list[FileJob], manifest_key: str,
                        planned: PlannedRestore) -> list[ThreadResult]:
        """Read a restore plan's ranged reads and verify them (each restore rank's
        manifest read an op of its own). By default refused in one line."""
        del jobs, manifest_key, planned
        raise SpecError(f"--format {self.name} cannot restore by a restore plan; allowed: "
                        "--restore-plan files")

    def cache_keys(self, jobs: list[FileJob]) -> list[str]:
        """Backend keys this process wrote for `jobs` (evicted from caches before restore)."""
        return [j.key for j in jobs]

    def _chunks_in_file(self, job: FileJob) -> int:
        """Non-empty chunks of the job's file (the digests its manifest entry holds)."""
        if job.reads is None:
            return len(job.regions)
        return sum(1 for c in self.plan.iter_chunks(job.index) if c.nbytes)

    @classmethod
    def written_names(cls, plan: Plan, groups: list[list[int]],
                      options: FormatOptions) -> list[str]:
        """Every name, relative to the checkpoint directory, that the processes running plan
        ranks `groups` (one list per process) write in one checkpoint, the runner's
        manifest aside: what a cleanup deletes, by name. By default the plan's files."""
        del options
        ranks = sorted({r for g in groups for r in g})
        return sorted({plan.file_paths[f] for r in ranks for f in plan.files_of_rank(r)})

    def read_manifest(self, manifest_key: str, jobs: list[FileJob]
                      ) -> tuple[Manifest, tuple[int, int]]:
        """Read the commit manifest, timed (it is the restore's first step), and check it
        covers `jobs` and was written in this format; refuse an uncommitted checkpoint or
        a manifest that does not hold what the restore needs (one line naming it)."""
        t0 = now()
        try:
            head, size = read_manifest_bytes(self.backend, manifest_key, self.block)
        except FileNotFoundError:
            raise VerificationError(
                f"{manifest_key}: no manifest; the checkpoint is incomplete and is not restored"
            ) from None
        t1 = now()
        manifest = Manifest.decode(head, manifest_key, size)
        manifest.covers(jobs, self._chunks_in_file)
        manifest.check_size()
        manifest.written_as(self.name)
        return manifest, (t0, t1)


def file_jobs(plan: Plan, ranks: list[int], checkpoint: str, iteration: int, seed: int,
              layout: RegionLayout | None = None) -> list[FileJob]:
    """The jobs of plan ranks `ranks` for one checkpoint (plan order)."""
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
