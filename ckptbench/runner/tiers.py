"""``--tiers``: every checkpoint to the memory and peer tiers, every N-th to storage, then
the restarts that read them, each measured and verified.

Per checkpoint, on every process (collectively, behind barriers so all run each step at
once, as a job's ranks do):

memory   a plain copy of the state into new memory (the physical limit), then the copy
         into the node's shared memory file (runner.tier_store): the blocking part, as
         async mode's snapshot is measured
peer     a plain transfer of the same bytes to the first holder over the same transport
         (discarded there), then the shard to each of its k holders, timed until every
         holder acknowledged the complete replica: over MPI point-to-point when MPI
         launched the run (runner.tier_mpi), else TCP sockets (runner.tier_peer)
storage  every --storage-every-th checkpoint: the ordinary save and restore (driver)

The copies of the checkpoint before the last two are removed as a new one is held. After
the last checkpoint, the restarts (each process's state dropped first):

process  a process restarts on its intact node: each reads its node's memory copy
node     the last node is replaced: its memory copies and the replicas it held are
         removed, its processes fetch their shards from surviving holders; the others
         read their memory copies
group    the last node's replication group is lost (it and every node holding its
         replicas): the newest checkpoint in storage (kept for this) restores, the shards
         no tier holds from storage by the DCP load plan, the rest from memory or
         surviving peers, at once (runner.tier_storage)

Every byte restored is checked against the save's digests (kept by process 0, as a
manifest is); a mismatch or a shard no tier holds is one line naming it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptbench.errors import RunFailed
from ckptbench.formats.base import everyone, file_jobs, from_root, now
from ckptbench.payload import PayloadGenerator, digest
from ckptbench.plan.restore_ranks import restore_positions
from ckptbench.plan.tier_reads import CopyRead, chunk_reads, copy_offsets, reshards
from ckptbench.plan.tiers import HELD_COPIES, TierPlan
from ckptbench.records import ErrorRecord
from ckptbench.runner.cleanup import remove_checkpoint
from ckptbench.runner.tier_mpi import TAG_PLAIN, TAG_REPLICA, MpiPeers
from ckptbench.runner.tier_peer import (
    PUT,
    SINK,
    PeerServer,
    open_links,
    send,
    send_all,
)
from ckptbench.runner.tier_reshard import ChunkDigests
from ckptbench.runner.tier_reshard_run import ReshardRestarts
from ckptbench.runner.tier_restart import (
    held_record,
)
from ckptbench.runner.tier_restart_run import SavedLayoutRestarts
from ckptbench.runner.tier_store import (
    Copy,
    NodeDir,
    PreparedCopy,
    RunDir,
    copy_name,
    make_run_dir,
    memory_pages,
    remove_names,
    touched,
)

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations


class TierRun:
    """One process's share of a tiered run."""

    def __init__(self, run: Iterations) -> None:
        assert run.options.tier_plan is not None
        self.run, self.comm, self.o = run, run.comm, run.options
        self.tp: TierPlan = run.options.tier_plan
        self.spec = self.tp.spec
        self.proc = self.comm.rank
        self.node = self.tp.node_of[self.proc]
        self.run_dir: RunDir | None = None  # made by _start (runner.tier_store)
        self.pages = memory_pages(self.spec.memory_dir) if self.spec.has("memory") else ""
        self.gen = PayloadGenerator(self.o.payload, self.o.seed)
        self.offset = self.comm.clock_offset_ns()
        self.records: list[dict[str, Any]] = []
        self.mine: list[Copy] = []  # this process's own copies, by name
        self.expected: dict[int, list[list[int]]] = {}  # process 0: it -> digests per process
        self.server: PeerServer | None = None
        self.addresses: list[tuple[str, int]] = []
        self.transport = ""
        self.mpi: MpiPeers | None = None  # MPI launched the run: replicas go by MPI
        self.sinks: dict[int, np.ndarray] = {}  # MPI: the plain transfers' destinations
        self.kept = 0  # the storage checkpoint kept for the group restart (0: none)
        # A [restore] layout other than the save's: the process and node restarts read
        # DCP's load plan from the copies (runner.tier_reshard), checked chunk by chunk.
        self.reads: list[CopyRead] | None = None
        self.restore_ranks: list[int] = []
        self.owners: dict[int, tuple[int, int]] = {}  # saved file -> (process, offset)
        self.chunk_digests: ChunkDigests = {}  # this process's, of the newest checkpoint
        self.expected_chunks: dict[int, ChunkDigests] = {}  # process 0: it -> all

    @property
    def dir(self) -> NodeDir:
        """This process's node's directory under --memory-dir (every copy goes through it)."""
        assert self.run_dir is not None, "made by _start"
        return self.run_dir.node(self.node)

    # --- the run ---
    def run_all(self) -> None:
        ok = False
        try:
            self._start()
            group = (self.tp.last_stored(self.o.iterations)
                     if self.o.restore and self.spec.use != ("storage",) else 0)
            for it in range(1, self.o.iterations + 1):
                self._checkpoint(it)
                if self.tp.stores(it):
                    self.run.claim(it)
                    self.run.save(it)
                    self._storage_restart(it, keep=it == group)
            if self.o.restore and self.spec.use != ("storage",):
                try:
                    self._restarts(self.o.iterations)
                except RunFailed as exc:  # every process alike: what ran is recorded
                    self._write_records(ErrorRecord(self.o.iterations, "restore", exc.kind,
                                                    str(exc)))
                    self.comm.barrier()  # process 0 has them before anyone leaves
                    raise
            self._write_records()
            ok = True
        finally:
            self._stop(ok)

    def _storage_restart(self, it: int, keep: bool) -> None:
        """The storage restart: measured, verified, removed; the newest one kept for the
        group restart (removed by :meth:`_stop`)."""
        if not keep:
            self.run.restore(it)
            return
        self.kept = it
        self.run.options = replace(self.o, keep=True)
        try:
            self.run.restore(it)
        finally:
            self.run.options = self.o

    def _start(self) -> None:
        self.run_dir = make_run_dir(self.comm, self.tp, self.o.run_id)
        if self.spec.keep and self.run.sink is not None:
            # where the copies are, before any checkpoint is held: a relaunch's --discard
            # finds them by it (runner.tier_relaunch)
            self.run.sink.write({"type": "tier_dirs", "run_id": self.o.run_id,
                                 "memory_dir": self.spec.memory_dir, **self.run_dir.record()})
            self.run.sink.flush()
        plan, rplan = self.run.plan, self.run.rplan
        if rplan is not None and reshards(rplan, plan):
            self.owners = copy_offsets(plan, everyone(self.comm, list(self.run.my_ranks)))
            self.restore_ranks = restore_positions(self.run.my_ranks, self.run.all_ranks,
                                                   plan.world_size, rplan.world_size, 0)
            self.reads = chunk_reads(rplan, self.restore_ranks, self.owners)
        # Peer links: the replicas' transport, and a resharded restart's fetches of chunks
        # whose copies are on other nodes.
        if self.spec.has("peer") or (self.reads is not None and self.tp.nodes > 1):
            self.server, self.mpi, self.addresses, self.transport = open_links(
                self.comm, self.tp, self.dir)
        self.jobs = file_jobs(self.run.plan, self.run.my_ranks, "tiers", 1, self.o.seed)
        self.nbytes = sum(j.size for j in self.jobs)
        self.files = everyone(self.comm, [(j.key.split("/", 1)[-1], j.size) for j in self.jobs]
                              ) if self.spec.keep else []
        self.sizes: list[int] = everyone(self.comm, self.nbytes)
        self.state: np.ndarray | None = touched(self.nbytes)  # as a training state is
        # the plain copy's destination; the holder's plain transfers use it too
        self.plain = touched(max(self.sizes))
        if self.server is not None:
            self.server.lend(self.plain)
        if self.mpi is not None:  # a plain transfer's destination per sender, off the clock
            self.sinks = {p: touched(self.sizes[p]) for p in self.tp.held_for(self.proc)
                          if self.tp.holders(p)[0] == self.proc}

    def _stop(self, ok: bool) -> None:
        if self.kept and self.comm.rank == 0 and not self.o.keep:
            remove_checkpoint(self.run.backend, self.run.made,
                              self.run.plan.checkpoint_name(self.kept))
        refused: OSError | None = None
        if not self.spec.keep and self.run_dir is not None:  # kept: a relaunch reads them
            try:
                remove_names(self.mine + (self.server.held if self.server is not None else []))
            except OSError as exc:  # the node's directory is not the one made: left alone
                refused = exc
        if self.server is not None:
            self.server.close()
        if ok:
            self.comm.barrier()  # every process's names gone before the directories
        if not self.spec.keep and self.run_dir is not None:
            self.run_dir.remove_node(self.node)
        if ok and refused is not None:
            raise refused

    # --- one checkpoint ---
    def _fill(self, it: int) -> list[int]:
        """The state of checkpoint `it` (training changed every byte), its digests per
        job; off the clock."""
        assert self.state is not None
        jobs = file_jobs(self.run.plan, self.run.my_ranks, "tiers", it, self.o.seed)
        digests, at = [], 0
        self.chunk_digests = {}
        for job in jobs:
            part = self.state[at:at + job.size]
            self.gen.fill(job.base, job.regions, 0, part)
            digests.append(digest(part))
            if self.reads is not None:  # what a resharded restart checks its chunks with
                self.chunk_digests.update({(job.index, g.start): digest(part[g.start:g.end])
                                           for g in job.regions})
            at += job.size
        return digests

    def _record(self, tier: str, it: int, t: tuple[int, int], baseline_s: float,
                baseline: str, **extra: Any) -> None:
        self.records.append({
            "type": "tier", "tier": tier, "iteration": it, "process": self.proc,
            "node": self.node, "bytes": self.nbytes, "start_ns": t[0] + self.offset,
            "end_ns": t[1] + self.offset, "blocking_s": (t[1] - t[0]) / 1e9,
            "baseline_s": baseline_s, "baseline": baseline, **extra})

    def _checkpoint(self, it: int) -> None:
        # The copies of the checkpoint before the last two go before this one's are made:
        # a node holds two checkpoints at most (the newest held one and the one in flight),
        # as the memory budget counts (plan.tiers.held_bytes) and async mode does.
        self.drop(it - HELD_COPIES)
        digests = self._fill(it)
        assert self.state is not None
        state = self.state
        gathered = self.comm.gather(digests)
        if gathered is not None:
            self.expected[it] = gathered
        if self.reads is not None:
            chunks = self.comm.gather(self.chunk_digests)
            if chunks is not None:
                self.expected_chunks[it] = {k: v for c in chunks for k, v in c.items()}
                self.expected_chunks.pop(it - HELD_COPIES, None)
        if self.spec.has("memory"):
            path = self.dir / copy_name(self.proc, it)
            self.mine.append(path)
            copy = PreparedCopy(path, self.nbytes)  # allocated off the clock, as is `plain`
            self.comm.barrier()
            t0 = now()
            np.copyto(self.plain[:self.nbytes], state)
            t1 = now()
            self.comm.barrier()
            t2 = now()
            copy.fill(state)
            t3 = now()
            # As after the plain copy: no process goes on (unmapping, preparing the peer
            # step's replica files: page allocation on the same CPUs) while another's
            # timed copy still runs.
            self.comm.barrier()
            copy.release()
            self._record("memory", it, (t2, t3), (t1 - t0) / 1e9, "plain copy",
                         where=self.spec.memory_dir, pages=self.pages)
        if self.spec.has("peer"):
            assert self.server is not None
            holders = self.tp.holders(self.proc)
            for src in self.tp.held_for(self.proc):  # off the clock
                self.server.prepare(src, it, self.sizes[src])
            t0, t1, t2, t3 = self._replicate(it, state, holders)
            self._record("peer", it, (t2, t3), (t1 - t0) / 1e9, "plain transfer",
                         transport=self.transport, holders=holders,
                         replicas=len(holders))
        self.comm.barrier()  # every copy of `it` held before anything goes on
        if self.spec.keep and self.run.sink is not None and it in self.expected:
            assert self.run_dir is not None
            self.run.sink.write(held_record(self.tp, self.o.run_id, it, self.files,
                                            self.expected[it], self.run_dir.record()))
            self.run.sink.flush()  # in the results before the next checkpoint starts

    def _replicate(self, it: int, state: np.ndarray, holders: list[int]
                   ) -> tuple[int, int, int, int]:
        """The plain transfer to the first holder, then the replicas to every holder
        (over MPI or TCP); the clock readings around each."""
        assert self.server is not None
        self.comm.barrier()
        t0 = now()
        if self.mpi is not None:
            self.mpi.exchange([(holders[0], state)], list(self.sinks.items()), TAG_PLAIN)
        else:
            send(self.addresses[holders[0]], SINK, self.proc, it, state)
        t1 = now()
        self.comm.barrier()
        t2 = now()
        if self.mpi is not None:
            copies = {p: self.server.take(p, it, self.sizes[p])
                      for p in self.tp.held_for(self.proc)}
            self.mpi.exchange([(h, state) for h in holders],
                              [(p, c.view) for p, c in copies.items()], TAG_REPLICA)
            for c in copies.values():
                c.commit()  # held only once every byte is in
            t3 = now()
            for c in copies.values():
                c.release()
        else:
            send_all([self.addresses[h] for h in holders], PUT, self.proc, it, state)
            t3 = now()
        return t0, t1, t2, t3

    def drop(self, it: int) -> None:
        if it < 1:
            return
        old = [p for p in self.mine if p.name == copy_name(self.proc, it)]
        remove_names(old)
        self.mine = [p for p in self.mine if p not in old]
        if self.server is not None:
            gone = [p for p in self.server.held if p.name.endswith(f"-ckpt{it}.bin")]
            remove_names(gone)
            self.server.held = [p for p in self.server.held if p not in gone]

    # --- restarts ---
    def _restarts(self, it: int) -> None:
        """The process and node restarts of checkpoint `it`, then the group's of the kept
        storage checkpoint: in the save's layout (runner.tier_restart_run), or onto the
        restore layout (runner.tier_reshard_run), each against the save's digests."""
        last = self.tp.nodes - 1
        scenarios = [("process", it, set()), *([("node", it, {last})]
                                              if self.spec.has("peer") else []),
                     *([("group", self.kept, set(self.tp.group(last)))] if self.kept else [])]
        for scenario, ckpt, lost in scenarios:
            if self.reads is not None:
                chunks = from_root(self.comm, self.expected_chunks.get(ckpt, {}))
                ReshardRestarts(self).restart(scenario, ckpt, lost, chunks)
            else:
                SavedLayoutRestarts(self).restart(scenario, ckpt, lost,
                                                  from_root(self.comm, self.expected.get(ckpt)))

    def agree(self, scenario: str, error: str | None) -> None:
        """Collective: every process fails the restart when one did, with its error."""
        errors = self.comm.gather(error)
        first = next((e for e in errors if e), None) if errors is not None else None
        first = self.comm.bcast(first)
        if first:  # no partial restart is summarized as one: its records go
            self.records = [r for r in self.records if r.get("scenario") != scenario]
            raise RunFailed(f"restart ({scenario}): {first}", "restore")

    def shard(self) -> str:
        ranks = ",".join(str(r) for r in self.run.my_ranks)
        return f"the shard of process {self.proc} (plan ranks {ranks})"

    def _write_records(self, error: ErrorRecord | None = None) -> None:
        gathered = self.comm.gather(self.records)
        if gathered is not None and self.run.sink is not None:
            self.run.sink.write_all([r for recs in gathered for r in recs])
            if error is not None:
                self.run.sink.write(error)
