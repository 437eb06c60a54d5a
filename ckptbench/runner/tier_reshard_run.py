"""A tiered run's restarts onto the restore layout: one process's share, collectively.

runner.tiers runs the restarts; when ``[restore]`` differs from the save's layout it hands
the process, node and group restarts to :class:`ReshardRestarts`, which plans each
process's reads (runner.tier_reshard: the nearest surviving copy of every chunk the load
plan gives its restore ranks), moves them in rounds beside their baselines, reads from
storage what no tier holds (the group restart) and checks every chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats.base import PlannedRestore, everyone, now
from ckptbench.formats.ranged import restore_jobs
from ckptbench.plan.tiers import HELD_COPIES
from ckptbench.runner.tier_reshard import (
    ChunkDigests,
    Mover,
    ReshardRestart,
    first_bad_chunk,
    plan_restart,
    reshard_record,
)
from ckptbench.runner.tier_restart import GROUP_ORDER, RESTART_ORDER
from ckptbench.runner.tier_storage import StorageJobs, beside_storage
from ckptbench.runner.tier_store import touched

if TYPE_CHECKING:
    from ckptbench.runner.tiers import TierRun


class ReshardRestarts:
    """The restarts of one process's tiered run (`t`) onto the restore layout."""

    def __init__(self, t: TierRun) -> None:
        self.t = t

    def restart(self, scenario: str, it: int, lost: set[int], expected: ChunkDigests
                ) -> None:
        """A restart onto the restore layout (runner.tier_reshard), collectively as one
        in the save's layout (runner.tier_restart_run): the state dropped (and a replaced
        node's copies), the memory for the restore ranks' chunks allocated, then the reads
        and their baselines in the order of RESTART_ORDER (the group's: GROUP_ORDER),
        every process at once; each chunk checked once all are in."""
        t = self.t
        if t.plain.nbytes < max(t.sizes):  # the baselines' memory, before the clock
            t.plain = touched(max(t.sizes))
            if t.server is not None:
                t.server.lend(t.plain)
        t.state = None
        if t.node in lost:
            t.drop(it)
        r, given, error = self._plan(scenario, it, lost)
        if scenario == "group":  # storage is read cold, as after its own save
            t.run.evict(it)
        mover = Mover(t.proc, t.dir, t.plain, t.addresses, t.mpi)
        if t.mpi is not None:  # what each holder serves, off the clock
            mover.asked = everyone(t.comm, r.requests())
        for step in GROUP_ORDER if scenario == "group" else RESTART_ORDER:
            t.comm.barrier()
            start = now()
            try:
                if given is not None and step == "read":
                    self._group_read(mover, r, error, given, start)
                    continue
                gone = mover.move(r, step == "baseline", error)
                r.rounds[step].append((start, now()))
                if gone and not error:
                    raise RunFailed(f"checkpoint {it}: {t.shard()}: {gone[0]}", "missing")
            except BaseException as exc:
                error = error or (str(exc) if isinstance(exc, RunFailed)
                                  else describe_error(exc)[1])
        t.comm.barrier()  # every process's bytes in before any checks them
        try:
            if error:
                raise RunFailed(error, "restore")
            self._check(r, expected)
        except BaseException as exc:
            error = describe_error(exc)[1] if not isinstance(exc, RunFailed) else str(exc)
        t.agree(scenario, error)

    def _plan(self, scenario: str, it: int, lost: set[int]
              ) -> tuple[ReshardRestart, StorageJobs | None, str | None]:
        """This process's sources and ranges (runner.tier_reshard), the group's storage
        jobs, or the error that stops it (it still serves others and enters every
        collective, with nothing of its own)."""
        assert self.t.reads is not None
        held = it > self.t.o.iterations - HELD_COPIES  # the tiers still hold checkpoint `it`
        try:
            r = plan_restart(scenario, it, lost, self.t.reads, self.t.tp, self.t.proc,
                             self.t.dir, self._missing_chunk(it, lost), held)
            return r, self._stored_jobs(r.stored, it) if scenario == "group" else None, None
        except BaseException as exc:
            error = str(exc) if isinstance(exc, RunFailed) else describe_error(exc)[1]
            r = ReshardRestart(scenario, it, lost, [], {}, np.empty(0, dtype=np.uint8))
            return r, ([], PlannedRestore([]), "") if scenario == "group" else None, error

    def _check(self, r: ReshardRestart, expected: ChunkDigests) -> None:
        """Every chunk the tiers served checked against the save's digest, then the
        record (none for a process the restore layout gives no rank)."""
        t0 = now()
        bad = first_bad_chunk(r, expected)
        if bad is not None:
            raise RunFailed(
                f"checkpoint {r.it}: {self.t.shard()}: file "
                f"{self.t.run.plan.file_paths[bad.file]} (the chunk at byte {bad.offset}) "
                f"from {r.sources[bad.owner].describe(self.t.tp)} differs from the "
                "save's digest", "verify")
        rec = reshard_record(r, self.t.tp, self.t.offset, (now() - t0) / 1e9,
                             self.t.restore_ranks, self.t.o.verify)
        self.t.state = r.data
        if r.reads or r.stored:
            self.t.records.append({"type": "tier_restore", "scenario": r.scenario,
                                   "iteration": r.it, "process": self.t.proc,
                                   "node": self.t.node, **rec, "lost_nodes": sorted(r.lost)})

    def _stored_jobs(self, stored: set[int], it: int) -> StorageJobs:
        """The group restart's storage reads onto the restore layout: the DCP load plan's
        ranged reads of the files whose owners no tier holds."""
        assert self.t.run.rplan is not None
        jobs = [j for j in restore_jobs(self.t.run.rplan, self.t.restore_ranks,
                                        self.t.run.checkpoint(it), self.t.run.saved_as(it),
                                        self.t.o.seed)
                if self.t.owners[j.index][0] in stored]
        return jobs, PlannedRestore(sorted({j.reader for j in jobs if j.reader is not None})), \
            "dcp plan"

    def _group_read(self, mover: Mover, r: ReshardRestart, error: str | None,
                    given: StorageJobs, t: int) -> None:
        """The group restart's read: the MPI fetches first (on this thread), then the
        node's own ranges and the TCP fetches beside the storage read of the chunks no
        tier holds, every process at once (runner.tier_storage). The read's clock: from
        `t` to the last of the two."""
        gone = mover.move(r, False, error, rest=False) if self.t.mpi is not None else []

        def serve() -> tuple[list[str], int]:
            if error:
                raise RunFailed(error, "restore")
            return mover.move(r, False, None, mpi=False), now()

        tier, r.part = beside_storage(self.t.run, r.it, serve if r.reads or error else None,
                                      given)
        gone += tier[0] if tier else []
        ends = [tier[1]] if tier else []
        if r.part.bytes:
            ends.append(r.part.end_ns)
        start = t if r.reads or not r.part.bytes else r.part.start_ns
        r.rounds["read"].append((start, max(ends, default=now())))
        if gone:
            raise RunFailed(f"checkpoint {r.it}: {self.t.shard()}: {gone[0]}", "missing")

    def _missing_chunk(self, it: int, lost: set[int]) -> Callable[[int, int], str]:
        def line(file: int, owner: int) -> str:
            path = self.t.run.plan.file_paths[file]
            return (f"checkpoint {it}: {self.t.shard()}: file {path} (saved by process "
                    f"{owner}): no tier holds it after losing node(s) {sorted(lost)}")
        return line
