"""A tiered run's restarts in the save's layout: one process's share, collectively.

runner.tiers runs the restarts; in the save's layout (no ``[restore]``, or the same one)
each process reads its own shard back: its node's memory copy, a surviving peer's replica,
or (the group restart) storage, interleaved with its baseline (runner.tier_restart), and
checks it against the save's digests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats.base import now
from ckptbench.plan.tiers import HELD_COPIES
from ckptbench.runner.tier_peer import SOURCE, fetch
from ckptbench.runner.tier_restart import Restart, first_mismatch, restart_rounds
from ckptbench.runner.tier_storage import beside_storage
from ckptbench.runner.tier_store import copy_name, read_copy, touched

if TYPE_CHECKING:
    from ckptbench.runner.tiers import TierRun


class SavedLayoutRestarts:
    """The restarts of one process's tiered run (`t`) in the save's layout."""

    def __init__(self, t: TierRun) -> None:
        self.t = t

    def restart(self, scenario: str, it: int, lost: set[int],
                expected: list[list[int]]) -> None:
        """One restart scenario, collectively: the state dropped (and a replaced node's
        copies), then the read back into memory allocated before the clock starts (a
        framework builds its model before it loads) interleaved with its baseline (a plain
        copy of the same bytes, or a plain transfer of them from the same holder), every
        process at once, in the order of restart_rounds; verified once all bytes are in. In
        the group scenario storage serves what no tier holds, beside the tiers."""
        held = it > self.t.o.iterations - HELD_COPIES  # the tiers still hold checkpoint `it`
        source = self.t.tp.serving_tier(self.t.proc, lost) if held else None
        if self.t.plain.nbytes < self.t.nbytes:  # the last restart took it as the state
            self.t.plain = touched(max(self.t.sizes))
            if self.t.server is not None:
                self.t.server.lend(self.t.plain)
        if self.t.state is None or self.t.state.nbytes != self.t.nbytes:
            # a restart onto another layout left its state in that layout: the plain
            # copy's source is one of this shard's size, written before the clock
            self.t.state = touched(self.t.nbytes)
        r = Restart(scenario, it, lost, source, self.t.plain[:self.t.nbytes], self.t.state)
        self.t.state = None  # the process restarts: its state is gone
        if self.t.node in lost:  # the node replaced: its copies are gone with it
            self.t.drop(it)
        if scenario == "group":  # storage is read cold, as after its own save
            self.t.run.evict(it)
        error: str | None = None
        fetching = source is not None and source[0] == "peer"
        for own, fetch_step in restart_rounds(scenario):
            self.t.comm.barrier()
            try:  # a collective part is entered after an error too: none waits for it
                self._round(fetch_step if fetching else own, fetch_step, r, error)
            except BaseException as exc:
                error = error or (str(exc) if isinstance(exc, RunFailed)
                                  else describe_error(exc)[1])
        # Every process's bytes in before any checks them: a digest taken beside another
        # process's read would take its CPU (2 cores, 8 processes), inside its seconds.
        self.t.comm.barrier()
        try:
            if error:
                raise RunFailed(error, "restore")
            t0 = now()
            if r.source is not None:
                self._verify(r.data, expected[self.t.proc], it, *r.source)
            rec = r.record(self.t.tp.node_of, self.t.offset, (now() - t0) / 1e9, self.t.o.verify)
            self.t.state, self.t.plain = r.data, np.empty(0, dtype=np.uint8)
            self.t.records.append({"type": "tier_restore", "scenario": scenario,
                                 "iteration": it, "process": self.t.proc, "node": self.t.node,
                                 **rec, "lost_nodes": sorted(lost)})
        except BaseException as exc:
            error = describe_error(exc)[1] if not isinstance(exc, RunFailed) else str(exc)
        self.t.agree(scenario, error)

    def _round(self, step: str, fetch_step: str, r: Restart, error: str | None) -> None:
        """One round of a restart, every process at once: the read into `r.data` or its
        baseline (`step`; the peer fetches' `fetch_step`), its clock readings kept in `r`.
        Its collective parts (an MPI exchange, the group's storage read) are entered after
        an `error` too, nothing else."""
        mpi = self.t.mpi is not None and self.t.spec.has("peer")
        t = now()
        got = self._mpi_fetch(r, plain=fetch_step == "baseline") if mpi else True
        if step == "read" and r.scenario == "group":
            def serve() -> tuple[int, int]:
                if error:
                    raise RunFailed(error, "restore")
                return self._tier_read(r, got, t)

            span, r.part = beside_storage(self.t.run, r.it, serve if r.source or error
                                          else None)
            r.rounds["read"].append(span or (r.part.start_ns, r.part.end_ns))
            return
        if error or (r.source is None and r.scenario == "group"):  # storage serves it
            return
        if r.source is None:
            raise RunFailed(self._missing(r.it, r.lost), "missing")
        if step == "read":
            r.rounds["read"].append(self._tier_read(r, got, t))
            return
        tier, holder = r.source
        if tier == "peer" and not mpi:
            fetch(self.t.addresses[holder], self.t.proc, r.it, r.data, SOURCE)
        elif tier == "memory":
            t = now()  # after the MPI exchange, which it took no part in
            if r.state is not None:
                np.copyto(r.data, r.state)
        r.rounds["baseline"].append((t, now()))

    def _tier_read(self, r: Restart, got: bool, t: int) -> tuple[int, int]:
        """`r.data` read from its tier's copy (peer under MPI: already fetched, since `t`,
        `got` whether it came); the clock readings around it."""
        assert r.source is not None
        tier, holder = r.source
        if tier == "memory":
            t = now()
            read_copy(self.t.dir / copy_name(self.t.proc, r.it), r.data)
        elif self.t.mpi is not None:
            if not got:
                raise RunFailed(self._missing(r.it, set(), holder), "missing")
        elif not fetch(self.t.addresses[holder], self.t.proc, r.it, r.data):
            raise RunFailed(self._missing(r.it, set(), holder), "missing")
        return t, now()

    def _mpi_fetch(self, r: Restart, plain: bool) -> bool:
        """Collective (MPI): every holder sends the replicas a restart fetches from it
        (`plain`: as many bytes of its plain-transfer memory, the baseline) into the
        fetching process's `r.data`; whether this process got its replica."""
        assert self.t.mpi is not None and self.t.server is not None
        held = r.it > self.t.o.iterations - HELD_COPIES
        sources = [self.t.tp.serving_tier(q, r.lost) if held else None
                   for q in range(len(self.t.sizes))]
        serves = [(q, self.t.plain if plain else self.t.server.path(q, r.it), self.t.sizes[q])
                  for q, src in enumerate(sources) if src == ("peer", self.t.proc)]
        mine = sources[self.t.proc]
        return self.t.mpi.fetch(serves, mine[1] if mine and mine[0] == "peer" else None,
                              r.data)

    def _missing(self, it: int, lost: set[int], holder: int | None = None) -> str:
        where = (f"its holder process {holder} has no replica" if holder is not None else
                 f"no tier holds it after losing node(s) {sorted(lost)}")
        return f"checkpoint {it}: {self.t.shard()}: {where}"

    def _verify(self, data: np.ndarray, want: list[int], it: int, tier: str,
                holder: int) -> None:
        bad = first_mismatch(data, [(j.key.split("/", 1)[-1], j.size) for j in self.t.jobs], want)
        if bad is not None:
            where = ("its node's memory copy" if tier == "memory" else
                     f"the replica on node {self.t.tp.node_of[holder]} (process {holder})")
            raise RunFailed(f"checkpoint {it}: {self.t.shard()}: file {bad} from {where} "
                            "differs from the save's digest", "verify")
