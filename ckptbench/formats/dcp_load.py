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
plan). Beside them: ``container_bytes``, the lengths of those items in DCP's files as its
``.metadata`` records them (each a torch.save container: the payload and its archive
records), which is not what was read; ``file_read_bytes``, the bytes DCP's reader
pulled from its files while loading them, and ``file_reads``, those reads. For a local
file they are the OS reads beneath the buffered stream DCP reads through (the reader's
streams stand on a buffer like ``open()``'s, over the file, their reads timed and
counted): torch.load seeks back to each item's archive head and on to its tail around
its data, and each seek refills the buffer, so more than the payload is read. For any
other stream (fsspec's), its ``read()``/``readinto()`` calls. Its ``parts`` come from
DCP's calls into its reader and from those reads, in seconds:

metadata     reading and unpickling ``.metadata`` (``read_metadata``)
planning     the local load plans, the coordinator's global plan and its scatter: DCP's
             load-side counterpart of the save's coordinator (up to ``read_data``)
data         the reads of DCP's files inside ``read_data`` (as ``file_reads`` counts them)
deserialise  the rest of ``read_data``: ``torch.load`` of each item (unpickling, storage
             set-up, the copies out of the stream's buffer), narrowing it to the piece,
             copying it in (torch's intra-op threads: runner.threads)
sync         waiting for the other ranks to finish (DCP's closing all_gather)

They add up to the op's seconds. A reader that is not DCP's ``FileSystemReader`` (or one
of its subclasses) has no streams to time: no ``deserialise``, and its ``data`` is the
whole ``read_data``.

``.metadata`` is unpickled with an allow-list (:mod:`ckptbench.formats.safe_unpickle`):
:class:`MetadataGuard` replaces the reader's ``read_metadata`` (DCP's own reads it with
``pickle.load``, so a checkpoint from elsewhere could run code on restore) by the same
read through the same stream, unpickled by ``MetadataUnpickler``, which refuses any global
but the classes DCP's ``Metadata`` is made of before it is imported or called. The refusal
reaches the run as one line (exit 2), not as DCP's ``CheckpointException`` of tracebacks.

Verified after the clock: each saved chunk read is regenerated, its digest checked
against the manifest's, and its overlap with the piece compared byte for byte.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.formats.base import FileJob, everyone, now
from ckptbench.formats.common import NP_DTYPES, ChunkTask, chunk_bytes
from ckptbench.formats.manifest import Digested
from ckptbench.formats.safe_unpickle import UnsafePickle, load_metadata
from ckptbench.formats.verify import describe_difference
from ckptbench.payload import PayloadGenerator
from ckptbench.plan import Plan
from ckptbench.plan.restore_ranks import restore_positions

PARTS = ("metadata", "planning", "data", "deserialise", "sync")


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


class _Refused(BaseException):
    """An :class:`UnsafePickle` on its way through ``dcp.load``: not an ``Exception``, so
    DCP's ``except Exception`` around ``read_metadata`` (which logs a traceback and falls
    back to per-rank ``__<rank>.metadata`` files) lets it pass; DCP's collectives wrap it
    like any other failure. :meth:`MetadataGuard.check` raises the refusal itself."""

    def __init__(self, error: UnsafePickle) -> None:
        super().__init__(str(error))
        self.error = error


class MetadataGuard:
    """DCP's storage `reader` with its ``read_metadata`` replaced, in place, by one that
    reads the same ``.metadata`` through the same stream (the reader's
    ``fs.create_stream``) and unpickles it with the allow-list. Only DCP's
    ``FileSystemReader`` and its subclasses (``FsspecReader``, s3torchconnector's
    ``S3StorageReader``: every reader ckptbench makes) are read that way; any other reader
    is refused (its own ``read_metadata`` would unpickle with no allow-list).

    After ``dcp.load``, :meth:`check` raises the refusal (one line) if there was one,
    whatever DCP made of it."""

    def __init__(self, reader: Any) -> None:
        from torch.distributed.checkpoint import FileSystemReader

        if not isinstance(reader, FileSystemReader):
            raise CkptbenchError(
                f"DCP storage reader {type(reader).__name__}: ckptbench reads DCP's .metadata "
                "only through a FileSystemReader's streams (unpickled with an allow-list); "
                "allowed: a directory, an fsspec URL, s3:// (botocore or s3torchconnector)")
        self.reader = reader
        self.refused: UnsafePickle | None = None
        reader.read_metadata = self._read_metadata

    def _read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """FileSystemReader.read_metadata (torch 2.15), unpickling with the allow-list."""
        from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

        del args
        reader = self.reader
        rank = kwargs.get("rank")  # the file's name as torch 2.15's reader gives it
        path = reader.fs.concat_path(reader.path, ".metadata" if rank is None
                                     else f"__{rank}.metadata")
        try:
            with reader.fs.create_stream(path, "rb") as stream:
                metadata = load_metadata(stream, str(path))
            if not isinstance(metadata, Metadata):
                raise UnsafePickle(f"{path}: holds a {type(metadata).__name__}, not DCP's "
                                   "Metadata; the checkpoint is not restored")
        except UnsafePickle as exc:
            self.refused = exc
            raise _Refused(exc) from None
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = reader.load_id
        return metadata

    def check(self) -> None:
        """Raise the refusal of ``.metadata`` (one line), if the load had one."""
        if self.refused is not None:
            raise self.refused


class _TimedRaw(io.RawIOBase):
    """The OS file under a buffered stream of DCP's reader, its reads timed and counted: the
    same buffering as the stream it stands in for (``open(path, "rb")``'s)."""

    def __init__(self, raw: Any, owner: TimedReader) -> None:
        super().__init__()
        self._raw = raw
        self._owner = owner

    def readinto(self, b: Any) -> Any:
        t0 = now()
        n = self._raw.readinto(b)
        self._owner.pulled(t0, n or 0)
        return n

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._raw.seekable())

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        return int(self._raw.seek(pos, whence))

    def tell(self) -> int:
        return int(self._raw.tell())

    def fileno(self) -> int:
        return int(self._raw.fileno())


class _TimedStream:
    """A file stream of DCP's reader that is not a local file (fsspec's): its read() and
    readinto() calls timed and counted."""

    def __init__(self, stream: Any, owner: TimedReader) -> None:
        self._stream = stream
        self._owner = owner

    def read(self, size: int = -1) -> Any:
        t0 = now()
        data = self._stream.read(size)
        self._owner.pulled(t0, len(data) if data is not None else 0)
        return data

    def readinto(self, b: Any) -> Any:
        t0 = now()
        n = self._stream.readinto(b)
        self._owner.pulled(t0, n or 0)
        return n

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        return int(self._stream.seek(pos, whence))

    def tell(self) -> int:
        return int(self._stream.tell())

    def seekable(self) -> bool:
        return bool(self._stream.seekable())

    def readable(self) -> bool:
        return bool(self._stream.readable())


def _buffer_size(raw: Any) -> int:
    """The buffer ``open()`` gives a file: its block size, else io.DEFAULT_BUFFER_SIZE."""
    try:
        size = os.fstat(raw.fileno()).st_blksize
    except (OSError, AttributeError, ValueError):
        return io.DEFAULT_BUFFER_SIZE
    return int(size) if size > 1 else io.DEFAULT_BUFFER_SIZE


def timed_stream(stream: Any, owner: TimedReader) -> Any:
    """`stream` with its reads timed where they happen: a local file's OS reads beneath a
    buffer like its own, any other stream's read() calls."""
    if isinstance(stream, io.BufferedReader) and isinstance(stream.raw, io.FileIO):
        return io.BufferedReader(_TimedRaw(stream.raw, owner), _buffer_size(stream.raw))
    return _TimedStream(stream, owner)


class TimedReader:
    """Times one ``dcp.load`` by DCP's calls into its storage reader (wrapped in place) and
    the reads of the file streams it opens (its ``fs.create_stream``, wrapped in place),
    and counts the bytes of the items its final plan reads. Its ``read_metadata``
    unpickles ``.metadata`` with the allow-list (:class:`MetadataGuard`); :meth:`count`,
    the first call after the load, raises a refusal of it (one line)."""

    def __init__(self, reader: Any) -> None:
        self.guard = MetadataGuard(reader)
        self.reader = reader
        self.marks: dict[str, int] = {}
        self.read_bytes = 0  # payload of the saved chunks read (DCP reads each whole)
        self.container_bytes = 0  # their lengths in DCP's files (as .metadata records)
        self.file_read_bytes = 0  # bytes read from DCP's files (the OS reads, local files)
        self.file_reads = 0
        self.read_ns = 0  # in those reads
        self.streams = False  # the reader's file streams are timed
        self.items = 0
        self._loading = False
        self._read: tuple[Any, ...] = ()
        for name in ("read_metadata", "read_data"):
            setattr(reader, name, self._timed(name, getattr(reader, name)))
        from torch.distributed.checkpoint import FileSystemReader

        if isinstance(reader, FileSystemReader):  # FsspecReader too: streams of reader.fs
            reader.fs.create_stream = self._streams(reader.fs.create_stream)
            self.streams = True

    def _streams(self, create: Any) -> Any:
        @functools.wraps(create)
        @contextlib.contextmanager
        def create_stream(*args: Any, **kwargs: Any) -> Iterator[Any]:
            with create(*args, **kwargs) as stream:
                yield timed_stream(stream, self) if self._loading else stream
        return create_stream

    def pulled(self, t0: int, n: int) -> None:
        """A read of `n` bytes that started at `t0` ended now."""
        self.read_ns += now() - t0
        self.file_read_bytes += n
        self.file_reads += 1

    def _timed(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.marks.setdefault(f"{name}_start", now())
            if name == "read_data":
                self._read = args
                self._loading = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._loading = False
                self.marks[f"{name}_end"] = now()
        return timed

    def count(self) -> None:
        """Bytes of the saved chunks DCP's final plan read, from DCP's metadata (after
        the load, off the clock). First, the refusal of DCP's ``.metadata``, if any: one
        line (UnsafePickle) instead of what ``dcp.load`` raised from it."""
        self.guard.check()
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
        """Seconds of each part of the load that ran from `t0` to `t1` (they add up);
        without timed streams, no ``deserialise`` (``data`` is all of ``read_data``)."""
        m = self.marks
        meta = m.get("read_metadata_end", t1)
        start = max(meta, m.get("read_data_start", t1))
        end = max(start, m.get("read_data_end", t1))
        reads = min(self.read_ns, end - start) if self.streams else end - start
        bounds = [t0, meta, start, start + reads, end, max(end, t1)]
        out = {p: (bounds[k + 1] - bounds[k]) / 1e9 for k, p in enumerate(PARTS)}
        if not self.streams:
            del out["deserialise"]
        return out

    def extra(self, t0: int, t1: int) -> dict[str, Any]:
        """What the ``dcp_load`` op records beside its payload bytes (after count())."""
        out: dict[str, Any] = {"container_bytes": self.container_bytes, "read_items": self.items}
        if self.streams:
            out.update(file_read_bytes=self.file_read_bytes, file_reads=self.file_reads)
        out["parts"] = self.parts(t0, t1)
        return out


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


__all__ = ["PARTS", "MetadataGuard", "TimedReader", "allocate_pieces", "check_load_processes",
           "load_group", "verify_pieces"]
