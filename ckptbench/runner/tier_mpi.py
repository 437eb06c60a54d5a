"""The peer tier's transport under mpirun/srun: MPI point-to-point between the ranks.

A job launched by MPI replicates over MPI, as the real systems use the launcher's fabric
(NVIDIA's local checkpointing exchanges replicas with the process group's send/recv), not
sockets of their own. Every exchange is collective and symmetric: each process knows
from the placement whom it sends to and whom it receives from, posts every receive
(``Irecv``) and every send (``Isend``) of large buffers in pieces of :data:`PIECE` (an MPI
count is a C int), then waits for all. Messages between a pair with one tag arrive in
the order sent, so one tag per kind of exchange is enough.

mpi4py runs MPI funneled (only the main thread calls it), so every exchange runs on the
main thread; a background replication (runner.async_peer) posts its requests when the
checkpoint is taken and the training loop tests them at its step boundaries. A restart's fetch tells the receiver first how many bytes the holder has
(:data:`MISSING` when it holds no replica), then sends them, so a missing replica is an
answer, never a hang.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ckptbench.runner.tier_store import Copy, open_held

PIECE = 256 << 20
MISSING = -1
TAG_REPLICA, TAG_PLAIN, TAG_SIZE, TAG_FETCH = 3201, 3202, 3203, 3204
TAG_RANGES_OK, TAG_RANGES = 3205, 3206

# Ranges of a copy: (offset in the copy, bytes, offset in the reader's memory).
Ranges = list[tuple[int, int, int]]


def _pieces(buf: np.ndarray) -> list[np.ndarray]:
    return [buf[i:i + PIECE] for i in range(0, buf.nbytes, PIECE)] or [buf]


class MpiPeers:
    """The run's MPI communicator (an MPIComm's), for the peer tier's exchanges."""

    def __init__(self, comm: Any) -> None:
        self.c, self.MPI = comm.c, comm.MPI

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]], tag: int) -> None:
        """Collective among the pairs named: every buffer of `recvs` filled from its
        source, every one of `sends` sent to its destination; returns when all are."""
        self.MPI.Request.Waitall(self.post(sends, recvs, tag))

    def post(self, sends: Sequence[tuple[int, np.ndarray]],
             recvs: Sequence[tuple[int, np.ndarray]], tag: int) -> list[Any]:
        """The receives and sends of :meth:`exchange` started, not waited for: the
        requests to test (:meth:`done`) or wait for (``MPI.Request.Waitall``)."""
        byte = self.MPI.BYTE
        reqs = [self.c.Irecv([p, byte], source=src, tag=tag)
                for src, buf in recvs for p in _pieces(buf) if p.nbytes]
        reqs += [self.c.Isend([p, byte], dest=dst, tag=tag)
                 for dst, buf in sends for p in _pieces(buf) if p.nbytes]
        return reqs

    def done(self, reqs: list[Any]) -> bool:
        """Whether every request has completed (``MPI_Testall``: it also drives them on,
        as a training loop's step boundary does in async checkpointing)."""
        return bool(self.MPI.Request.Testall(reqs))

    def fetch(self, serves: Sequence[tuple[int, Path | Copy | np.ndarray, int]],
              source: int | None,
              out: np.ndarray) -> bool:
        """Collective restart fetch. `serves`: (process, its replica's file, or memory to
        send as many bytes from (the plain transfer: written before the clock, never the
        zero page), its shard's bytes) for each process this one serves; `source`: the
        process serving this one (None: none); `out`: where its bytes go. False when the
        holder has no replica of the shard's size."""
        sizes = np.full(len(serves), MISSING, dtype=np.int64)
        maps: list[tuple[int, mmap.mmap | None, np.ndarray]] = []
        for k, (proc, path, nbytes) in enumerate(serves):
            if isinstance(path, np.ndarray):
                maps.append((proc, None, path[:nbytes]))
            else:
                f = _held(path)
                if f is None:
                    continue
                with f:
                    if os.fstat(f.fileno()).st_size != nbytes:
                        continue
                    mapped = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_READ) \
                        if nbytes else None
                data = (np.frombuffer(mapped, dtype=np.uint8) if mapped is not None
                        else np.empty(0, dtype=np.uint8))
                maps.append((proc, mapped, data))
            sizes[k] = nbytes
        got = np.full(1, MISSING, dtype=np.int64)
        self.exchange([(p, sizes[k:k + 1]) for k, (p, _, _) in enumerate(serves)],
                      [(source, got)] if source is not None else [], TAG_SIZE)
        ok = source is not None and int(got[0]) == out.nbytes
        try:
            self.exchange([(p, data) for p, _, data in maps],
                          [(source, out)] if ok and source is not None else [], TAG_FETCH)
        finally:
            mapped_files = [m for _, m, _ in maps if m is not None]
            maps.clear()  # the views go before their maps close
            for m in mapped_files:
                with contextlib.suppress(BufferError):
                    m.close()
        return ok


def _held(source: Path | Copy) -> io.BufferedReader | None:
    """The held copy opened for reading through its directory's checked descriptor
    (runner.tier_store); None when there is none, or when its directory is not the one the
    run made (a collective exchange is no place to stop: the reader is told it is missing)."""
    with contextlib.suppress(OSError):
        fd = open_held(source)
        return None if fd is None else open(fd, "rb")
    return None


def _map_for(source: Path | Copy | np.ndarray, need: int
             ) -> tuple[mmap.mmap | None, np.ndarray] | None:
    """A copy's file mapped for reading, or the plain memory given; None when the file is
    missing or shorter than `need`."""
    if isinstance(source, np.ndarray):
        return None, source
    f = _held(source)
    if f is None:
        return None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < need:
            return None
        if need == 0:
            return None, np.empty(0, dtype=np.uint8)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return mapped, np.frombuffer(mapped, dtype=np.uint8)


def fetch_ranges(peers: MpiPeers,
                 serves: Sequence[tuple[int, Path | Copy | np.ndarray, Ranges]],
                 wants: Sequence[tuple[int, Ranges]], out: np.ndarray) -> list[bool]:
    """Collective restart fetch onto another layout. `serves`: (reader, the copy's file
    or plain memory, its ranges) for each request made of this process, in the order the
    reader made them; `wants`: (holder, ranges) for each request this process makes, in
    its order; each range goes into `out` at its offset. Per want, whether its holder had
    the copy (a holder without it sends nothing for it)."""
    maps: list[tuple[mmap.mmap | None, np.ndarray] | None] = [
        _map_for(src, max((at + n for at, n, _ in rs), default=0)) for _, src, rs in serves]
    flags = [np.full(1, 1 if m is not None else MISSING, dtype=np.int64) for m in maps]
    got = [np.full(1, MISSING, dtype=np.int64) for _ in wants]
    try:
        peers.exchange([(reader, flag) for (reader, _, _), flag in zip(serves, flags,
                                                                         strict=True)],
                       [(holder, g) for (holder, _), g in zip(wants, got, strict=True)],
                       TAG_RANGES_OK)
        ok = [int(g[0]) == 1 for g in got]
        sends = [(reader, m[1][at:at + n]) for (reader, _, rs), m in zip(serves, maps,
                                                                           strict=True)
                 if m is not None for at, n, _ in rs]
        recvs = [(holder, out[dest:dest + n]) for (holder, rs), fine in zip(wants, ok,
                                                                             strict=True)
                 if fine for _, n, dest in rs]
        peers.exchange(sends, recvs, TAG_RANGES)
        return ok
    finally:
        mapped = [m[0] for m in maps if m is not None and m[0] is not None]
        sends = recvs = []
        maps.clear()  # the views go before their maps close
        for m in mapped:
            with contextlib.suppress(BufferError):
                m.close()


def node_local(hosts: Sequence[str]) -> str:
    """What MPI's "network" is here: one host's shared memory, or the fabric between
    hosts (the record's transport)."""
    return "mpi-shm" if len(set(hosts)) == 1 else "mpi"
