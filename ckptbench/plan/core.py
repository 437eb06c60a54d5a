"""The plan: every chunk each rank writes, the file that holds it, and where.

Plans for the Llama 3 cluster hold millions of chunks, so the chunk table is a set of
parallel numpy arrays (read-only) rather than millions of objects; per-rank and per-file
views are cheap slices. Chunks are stored sorted by (file, offset in file).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ckptbench.spec import DTYPE_BYTES, Workload

PLAN_SCHEMA = "ckptbench.plan/1"
MANIFEST_NAME = ".metadata"


@dataclass(frozen=True)
class StateKey:
    """One state-dict entry (a flattened DCP key) and its global tensor."""

    name: str
    dtype: str
    global_shape: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class ChunkView:
    """One chunk, materialized for callers that want objects (small numbers of them)."""

    index: int
    key: str
    dtype: str
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    nbytes: int
    file_offset: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "dtype": self.dtype,
            "global_shape": list(self.global_shape),
            "offsets": list(self.offsets),
            "sizes": list(self.sizes),
            "nbytes": self.nbytes,
        }


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class Plan:
    workload: Workload
    keys: tuple[StateKey, ...]
    chunk_key: np.ndarray  # int32 [n] index into keys
    chunk_offsets: np.ndarray  # int64 [n, MAX_DIMS]
    chunk_sizes: np.ndarray  # int64 [n, MAX_DIMS]
    chunk_nbytes: np.ndarray  # int64 [n]
    chunk_file: np.ndarray  # int32 [n]
    chunk_file_offset: np.ndarray  # int64 [n]
    file_paths: tuple[str, ...]  # relative to the checkpoint directory
    file_rank: np.ndarray  # int32 [files], non-decreasing
    checkpoint_dir: str  # directory name for one checkpoint; "{step}" is replaced
    manifest: str = MANIFEST_NAME
    file_bytes: np.ndarray = field(init=False, repr=False)  # derived in __post_init__
    # Where each file's chunks and each rank's files start (derived in __post_init__).
    _file_ptr: np.ndarray = field(init=False, repr=False)
    _rank_ptr: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("chunk_key", "chunk_offsets", "chunk_sizes", "chunk_nbytes", "chunk_file",
                     "chunk_file_offset", "file_rank"):
            object.__setattr__(self, name, _readonly(getattr(self, name)))
        nfiles = len(self.file_paths)
        object.__setattr__(
            self, "_file_ptr", np.searchsorted(self.chunk_file, np.arange(nfiles + 1))
        )
        object.__setattr__(
            self, "_rank_ptr", np.searchsorted(self.file_rank, np.arange(self.world_size + 1))
        )
        object.__setattr__(
            self, "file_bytes", np.bincount(self.chunk_file, weights=self.chunk_nbytes,
                                            minlength=nfiles).astype(np.int64)
        )

    # --- sizes ---

    @property
    def world_size(self) -> int:
        return self.workload.parallel.world_size

    @property
    def total_bytes(self) -> int:
        return int(self.chunk_nbytes.sum())

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_key)

    @property
    def n_files(self) -> int:
        return len(self.file_paths)

    def rank_bytes(self) -> np.ndarray:
        """Bytes each rank writes (after dedup), int64 [world_size]."""
        return np.bincount(self.file_rank, weights=self.file_bytes,
                           minlength=self.world_size).astype(np.int64)

    def bytes_of_ranks(self, ranks: list[int]) -> int:
        """Bytes a subset of ranks writes per checkpoint."""
        return int(self.rank_bytes()[ranks].sum()) if ranks else 0

    # --- views ---
    def files_of_rank(self, rank: int) -> range:
        ptr = self._rank_ptr
        return range(int(ptr[rank]), int(ptr[rank + 1]))

    def chunks_of_file(self, file: int) -> range:
        ptr = self._file_ptr
        return range(int(ptr[file]), int(ptr[file + 1]))

    def chunk(self, i: int) -> ChunkView:
        key = self.keys[int(self.chunk_key[i])]
        nd = len(key.global_shape)
        return ChunkView(
            index=i,
            key=key.name,
            dtype=key.dtype,
            global_shape=key.global_shape,
            offsets=tuple(int(x) for x in self.chunk_offsets[i, :nd]),
            sizes=tuple(int(x) for x in self.chunk_sizes[i, :nd]),
            nbytes=int(self.chunk_nbytes[i]),
            file_offset=int(self.chunk_file_offset[i]),
        )

    def iter_chunks(self, file: int) -> Iterator[ChunkView]:
        for i in self.chunks_of_file(file):
            yield self.chunk(i)

    def checkpoint_name(self, step: int) -> str:
        return self.checkpoint_dir.format(step=step)


def finalize(
    workload: Workload,
    keys: list[StateKey],
    chunk_key: np.ndarray,
    chunk_offsets: np.ndarray,
    chunk_sizes: np.ndarray,
    chunk_nbytes: np.ndarray,
    chunk_file: np.ndarray,
    file_paths: list[str],
    file_rank: np.ndarray,
    checkpoint_dir: str,
) -> Plan:
    """Sort chunks by file (stable: the given order is the order inside each file) and
    lay them out back to back, giving each its byte offset within its file. Chunks that
    come sorted (the usual case) are not copied."""
    if len(chunk_file) and not np.all(chunk_file[1:] >= chunk_file[:-1]):
        order = np.argsort(chunk_file, kind="stable")
        chunk_key, chunk_offsets, chunk_sizes, chunk_nbytes, chunk_file = (
            a[order] for a in (chunk_key, chunk_offsets, chunk_sizes, chunk_nbytes, chunk_file))
    n = len(chunk_file)
    file_offset = np.cumsum(chunk_nbytes, dtype=np.int64)
    file_offset -= chunk_nbytes  # each chunk's start in the whole stream
    if n:
        starts = np.flatnonzero(chunk_file[1:] != chunk_file[:-1]) + 1
        run_start = np.concatenate([[0], starts])
        run_len = np.diff(np.concatenate([run_start, [n]]))
        file_offset -= np.repeat(file_offset[run_start], run_len)
    return Plan(
        workload=workload,
        keys=tuple(keys),
        chunk_key=chunk_key.astype(np.int32, copy=False),
        chunk_offsets=chunk_offsets,
        chunk_sizes=chunk_sizes,
        chunk_nbytes=chunk_nbytes.astype(np.int64, copy=False),
        chunk_file=chunk_file.astype(np.int32, copy=False),
        chunk_file_offset=file_offset,
        file_paths=tuple(file_paths),
        file_rank=file_rank.astype(np.int32, copy=False),
        checkpoint_dir=checkpoint_dir,
    )
