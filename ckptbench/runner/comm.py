"""Rank-to-rank operations the engine needs, behind one small interface.

The engine only ever calls barrier, gather (to process 0) and bcast (from process 0),
collectively and in the same order on every process, so a message can never be taken
for another. Local processes implement it with multiprocessing (:class:`ProcessComm`);
MPI ranks with mpi4py (:class:`ckptbench.runner.launch_mpi.MPIComm`).

Clocks: every timestamp a process reports is its ``perf_counter_ns`` plus
:meth:`Comm.clock_offset_ns`, so records of all processes share process 0's time base.
Processes on one host share CLOCK_MONOTONIC (offset 0); MPI measures each other node's
offset before the run (and again after it, for the record).
"""

from __future__ import annotations

import queue
import time
from abc import ABC, abstractmethod
from typing import Any

COMM_TIMEOUT_S = 3600.0


class CommError(RuntimeError):
    """A peer did not answer in time or the group was aborted."""


class Comm(ABC):
    rank: int = 0
    size: int = 1
    kind: str = "single"

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def gather(self, obj: Any) -> list[Any] | None:
        """Process 0 gets every process's obj in rank order; the others get None."""

    @abstractmethod
    def bcast(self, obj: Any) -> Any:
        """Every process gets process 0's obj."""

    def clock_offset_ns(self) -> int:
        """What to add to this process's perf_counter_ns to be on process 0's clock."""
        return 0

    def host(self) -> str:
        import socket

        return socket.gethostname()

    def abort(self, code: int = 1) -> None:
        """Stop every process of the group now (a peer failed outside a collective)."""
        return None


class SingleComm(Comm):
    def barrier(self) -> None:
        return None

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def bcast(self, obj: Any) -> Any:
        return obj


class ProcessComm(Comm):
    """Local processes forked from one parent: a shared barrier and one inbox each."""

    kind = "local-processes"

    def __init__(self, rank: int, size: int, barrier: Any, inboxes: list[Any]) -> None:
        self.rank, self.size = rank, size
        self._barrier = barrier
        self._inboxes = inboxes

    def barrier(self) -> None:
        import threading

        try:
            self._barrier.wait(timeout=COMM_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise CommError("a peer process left the run") from None

    def _get(self, box: Any) -> Any:
        deadline = time.monotonic() + COMM_TIMEOUT_S
        while True:
            try:
                return box.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline or self._barrier.broken:
                    raise CommError("a peer process stopped answering") from None

    def gather(self, obj: Any) -> list[Any] | None:
        if self.rank != 0:
            self._inboxes[0].put((self.rank, obj))
            return None
        out: list[Any] = [None] * self.size
        out[0] = obj
        for _ in range(self.size - 1):
            r, o = self._get(self._inboxes[0])
            out[r] = o
        return out

    def bcast(self, obj: Any) -> Any:
        if self.rank == 0:
            for r in range(1, self.size):
                self._inboxes[r].put(obj)
            return obj
        return self._get(self._inboxes[self.rank])

    def abort(self, code: int = 1) -> None:
        self._barrier.abort()
