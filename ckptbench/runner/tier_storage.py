"""Restart scenario (c), a replication group lost: the shards no tier holds come back from
storage, the rest from the tiers, at once.

When a node and every node holding its replicas are gone (a switch or a rack), its
processes' shards survive only in the last checkpoint the storage tier holds. A job then
restarts from that checkpoint: the processes whose shards no tier holds read them from
storage by the DCP load plan (each of its restore ranks reads the saved chunks DCP's load
planner gives it, ranged, every chunk checked against the manifest's digest), while the
others read their node's memory copy or a surviving peer's replica of the same checkpoint.

The format's restore is collective (it starts behind a barrier), so every process enters
it: one that storage serves with its jobs, the others with none, their tier read running
in a thread beside it. Errors are kept until the collective part is over, so no process is
left waiting for one that failed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats.base import FileJob, PlannedRestore, first_error, now
from ckptbench.formats.ranged import restore_jobs

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations

R = TypeVar("R")


@dataclass
class StoragePart:
    """What one process's share of the collective storage read did (bytes 0: none)."""

    start_ns: int = 0
    end_ns: int = 0
    bytes: int = 0
    reads: str = ""  # "dcp plan" or "files"
    mismatch: str | None = None
    error: str | None = None


def storage_jobs(run: Iterations, it: int) -> tuple[list[FileJob], PlannedRestore | None, str]:
    """This process's reads of checkpoint `it` onto its own ranks: by the DCP load plan
    where the run has one on the save's layout (ranged reads of the chunks the planner
    gives each rank), else its ranks' files whole."""
    rplan, plan = run.rplan, run.plan
    if rplan is not None and rplan.layout == plan.workload.parallel:
        jobs = restore_jobs(rplan, run.my_ranks, run.checkpoint(it), run.saved_as(it),
                            run.options.seed)
        return jobs, PlannedRestore(list(run.my_ranks)), "dcp plan"
    return run.jobs(it), None, "files"


StorageJobs = tuple[list[FileJob], PlannedRestore | None, str]


def _storage_read(run: Iterations, it: int, mine: bool, given: StorageJobs | None = None
                  ) -> StoragePart:
    """Collective: the format's restore of checkpoint `it`: the jobs `given` (a restart
    onto another layout: the chunks no tier holds), else this process's jobs when `mine`,
    none otherwise; errors and mismatches kept, never raised."""
    jobs, planned, reads = given if given is not None else storage_jobs(run, it)
    if not mine and given is None:
        jobs, planned = [], PlannedRestore([]) if planned is not None else None
    part = StoragePart(reads=reads if mine else "")
    manifest_key = f"{run.checkpoint(it)}/{run.plan.manifest}"
    try:
        t0 = now()
        restored = run.fmt.restore(jobs, manifest_key, planned)
        t1 = now()
        err = first_error(restored.results)
        if err is not None:
            part.error = describe_error(err)[1]
        misses = [m for r in restored.results for m in r.mismatches]
        part.mismatch = misses[0] if misses else None
        part.bytes = sum(op.nbytes for r in restored.results for op in r.ops
                         if op.op == "read")
        part.start_ns, part.end_ns = t0, t1
    except BaseException as exc:
        part.error = describe_error(exc)[1]
    return part


def beside_storage(run: Iterations, it: int, serve: Callable[[], R] | None,
                   given: StorageJobs | None = None) -> tuple[R | None, StoragePart]:
    """Collective: this process's tier read `serve` (None: storage serves it) in a thread
    beside the storage read every process enters (of the jobs `given`, where the caller
    chose them); what it returned and the storage part. A tier read's error is raised once
    the collective part is over."""
    out: list[R] = []
    errors: list[BaseException] = []

    def tier() -> None:
        try:
            assert serve is not None
            out.append(serve())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=tier, daemon=True) if serve is not None else None
    if thread is not None:
        thread.start()
    part = _storage_read(run, it, thread is None, given)
    if thread is not None:
        thread.join()
    if errors:
        raise errors[0]
    if part.error:
        raise RunFailed(f"checkpoint {it}: the storage read: {part.error}", "storage")
    if part.mismatch:
        raise RunFailed(f"checkpoint {it}: from storage: {part.mismatch}", "verify")
    return (out[0] if out else None), part
