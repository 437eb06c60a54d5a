"""The intra-op threads of the rank processes, set as a launcher sets them.

torch runs its CPU work (``torch.load``'s unpickling and copies, ``narrow``, ``copy_``)
on an intra-op thread pool whose default size is the machine's cores, in every process.
A node running several processes oversubscribes its cores that way, which is why
torchrun sets ``OMP_NUM_THREADS=1`` for each process when a node runs more than one
(and leaves torch's default when it runs one). On a small machine that choice alone
decides a torch-dcp restore's time several times over, so ckptbench sets it as torchrun
does and records it:

* ``--intra-op-threads auto`` (the default): 1 when a node runs several of the run's
  processes, else the cores this process may run on (its CPU affinity);
* ``--intra-op-threads N``: N.

The session resolves the value once the topology is known (:func:`resolve`); each rank
process sets it before its format does any work (:func:`applied`: ``OMP_NUM_THREADS`` for
anything it starts, and ``torch.set_num_threads`` for the formats that run torch) and
reports what it runs with (:func:`in_effect`: torch's own count where torch is loaded),
which each rank record carries. Formats without torch (raw, zarr) ignore it; it is
recorded for them all the same.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_INTRA_OP_THREADS = 1024
AUTO = "auto"
TORCH_FORMATS = ("torch-dcp", "torch-save")  # formats whose ranks run torch
ENV = "OMP_NUM_THREADS"
_set: list[int] = []  # the value this process set (applied), innermost last


def cores() -> int:
    """The cores this process may run on (its CPU affinity; else the machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class IntraOpThreads:
    """The threads each rank process runs, and why (the run record's ``intra_op_threads``)."""

    value: int
    source: str  # option | auto
    processes_per_node: int
    why: str

    def record(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source,
                "processes_per_node": self.processes_per_node, "why": self.why}


def resolve(asked: int, hosts: list[str], available: int | None = None) -> IntraOpThreads:
    """The intra-op threads of a run whose processes run on `hosts` (one entry each):
    `asked` when given (> 0); auto (0): 1 when a node runs several processes (as torchrun
    sets OMP_NUM_THREADS=1), else `available` cores (this process's)."""
    per_node = max((hosts.count(h) for h in set(hosts)), default=1)
    if asked > 0:
        return IntraOpThreads(asked, "option", per_node, f"--intra-op-threads {asked}")
    if per_node > 1:
        return IntraOpThreads(1, AUTO, per_node,
                              f"auto: {per_node} processes per node (as torchrun sets "
                              "OMP_NUM_THREADS=1 when a node runs several)")
    n = cores() if available is None else available
    return IntraOpThreads(n, AUTO, per_node,
                          f"auto: one process per node, its {n} cores (torch's default)")


def _torch(load: bool) -> Any:
    """torch when this process has it loaded, or loads it (`load`); else None."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if not load:
        return None
    try:
        import torch
    except ImportError:  # the format says so in one line when it opens
        return None
    return torch


@contextlib.contextmanager
def applied(threads: int, format_name: str) -> Iterator[None]:
    """This process runs `threads` intra-op threads while inside (0: left as it is):
    OMP_NUM_THREADS for what it starts, torch.set_num_threads where the format runs
    torch (imported here, before the format does any work) or torch is loaded. What was
    set before is put back on the way out (a rank run inside the caller's process)."""
    if threads <= 0:
        yield
        return
    torch = _torch(format_name in TORCH_FORMATS)
    env = os.environ.get(ENV)
    before = torch.get_num_threads() if torch is not None else None
    os.environ[ENV] = str(threads)
    if torch is not None:
        torch.set_num_threads(threads)
    _set.append(threads)
    try:
        yield
    finally:
        _set.pop()
        if env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = env
        if torch is not None and before is not None:
            torch.set_num_threads(before)


def in_effect() -> int | None:
    """The intra-op threads this process runs with: torch's count where torch is loaded,
    else the value set (None: none set, no torch)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.get_num_threads())
    return _set[-1] if _set else None


__all__ = ["AUTO", "MAX_INTRA_OP_THREADS", "TORCH_FORMATS", "IntraOpThreads", "applied",
           "cores", "in_effect", "resolve"]
