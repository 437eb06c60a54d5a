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
from typing import Protocol, TypeVar, cast

from ckptbench.runner.scheduler import node_name

COMM_TIMEOUT_S = 3600.0


T = TypeVar("T")  # what a collective carries: a gather returns a list of it


class CommError(RuntimeError):
    """A peer did not answer in time or the group was aborted."""


class Comm(ABC):
    rank: int = 0
    size: int = 1
    kind: str = "single"

    @abstractmethod
    def barrier(self) -> None: ...

    @abstractmethod
    def gather(self, obj: T) -> list[T] | None:
        """Process 0 gets every process's obj in rank order; the others get None."""

    @abstractmethod
    def bcast(self, obj: T) -> T:
        """Every process gets process 0's obj."""

    def clock_offset_ns(self) -> int:
        """What to add to this process's perf_counter_ns to be on process 0's clock."""
        return 0

    def host(self) -> str:
        """The node this process is counted on (Slurm's node name, else the host name)."""
        return node_name()

    def abort(self, code: int = 1) -> None:
        """Stop every process of the group now (a peer failed outside a collective)."""
        return None


class SingleComm(Comm):
    def barrier(self) -> None:
        return None

    def gather(self, obj: T) -> list[T]:
        return [obj]

    def bcast(self, obj: T) -> T:
        return obj


class SharedFlag(Protocol):
    """A multiprocessing RawValue's face: nonzero once any process sets it."""

    value: int


class Inbox(Protocol):
    """A multiprocessing Queue's face, as the processes' messages use it."""

    def put(self, obj: object) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> object: ...

    def close(self) -> None: ...

    def cancel_join_thread(self) -> None: ...

    def join_thread(self) -> None: ...


class ProcessComm(Comm):
    """Local processes forked from one parent: one inbox each and a shared abort flag.

    The barrier is a gather and a bcast through the inboxes, never a multiprocessing
    Barrier: a process killed inside one holds its lock, and every later wait or abort
    (the parent's too) blocks for ever. Every wait here is bounded and looks at the flag,
    a plain shared byte that anyone (the parent first) sets without a lock."""

    kind = "local-processes"

    def __init__(self, rank: int, size: int, aborted: SharedFlag, inboxes: list[Inbox]
                 ) -> None:
        self.rank, self.size = rank, size
        self._aborted = aborted  # a shared value (multiprocessing RawValue): nonzero = abort
        self._inboxes = inboxes
        self._early: dict[int, list[object]] = {}  # process 0: a fast peer's next gathers

    def barrier(self) -> None:
        self.gather(None)
        self.bcast(None)

    def _get(self, box: Inbox) -> object:
        deadline = time.monotonic() + COMM_TIMEOUT_S
        while True:
            if self._aborted.value:
                raise CommError("a peer process left the run")
            try:
                return box.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise CommError("a peer process stopped answering") from None

    def gather(self, obj: T) -> list[T] | None:
        if self.rank != 0:
            self._inboxes[0].put((self.rank, obj))
            return None
        out: list[object] = [None] * self.size
        out[0] = obj
        missing = set(range(1, self.size))
        for r in list(missing):  # what a peer sent for this gather before the last one ended
            if self._early.get(r):
                out[r] = self._early[r].pop(0)
                missing.discard(r)
        while missing:
            r, o = cast(tuple[int, object], self._get(self._inboxes[0]))
            if r in missing:
                out[r] = o
                missing.discard(r)
            else:  # a peer already in the next gather (no bcast between the two)
                self._early.setdefault(r, []).append(o)
        return cast(list[T], out)  # what each process passed (as T)

    def bcast(self, obj: T) -> T:
        if self.rank == 0:
            for r in range(1, self.size):
                self._inboxes[r].put(obj)
            return obj
        return cast(T, self._get(self._inboxes[self.rank]))  # process 0's obj

    def abort(self, code: int = 1) -> None:
        self._aborted.value = 1

    def close(self, ok: bool) -> None:
        """Before this process exits: a collective's last messages (a bcast) must reach the
        peers, or one waits for them until COMM_TIMEOUT_S; after a failure they are
        dropped (a peer gone would never read them, and the flush would block)."""
        for box in self._inboxes:
            box.close()
            if not ok:
                box.cancel_join_thread()
            box.join_thread()
