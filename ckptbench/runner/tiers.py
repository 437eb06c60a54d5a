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

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats.base import PlannedRestore, everyone, file_jobs, from_root, now
from ckptbench.formats.ranged import restore_jobs, restore_positions
from ckptbench.payload import PayloadGenerator, digest
from ckptbench.plan.tier_reads import CopyRead, chunk_reads, copy_offsets, reshards
from ckptbench.plan.tiers import HELD_COPIES, TierPlan
from ckptbench.records import ErrorRecord
from ckptbench.runner.cleanup import remove_checkpoint
from ckptbench.runner.tier_mpi import TAG_PLAIN, TAG_REPLICA, MpiPeers
from ckptbench.runner.tier_peer import (
    PUT,
    SINK,
    SOURCE,
    PeerServer,
    fetch,
    open_links,
    send,
    send_all,
)
from ckptbench.runner.tier_reshard import (
    ChunkDigests,
    Mover,
    ReshardRestart,
    first_bad_chunk,
    plan_restart,
    reshard_record,
)
from ckptbench.runner.tier_restart import (
    GROUP_ORDER,
    RESTART_ORDER,
    Restart,
    held_record,
    restart_rounds,
)
from ckptbench.runner.tier_storage import StorageJobs, beside_storage
from ckptbench.runner.tier_store import (
    PreparedCopy,
    copy_name,
    make_dirs,
    memory_pages,
    node_dir,
    read_copy,
    remove_dirs,
    remove_names,
    touched,
)

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations


def first_mismatch(data: np.ndarray, files: list[tuple[str, int]], want: list[int]
                   ) -> str | None:
    """The first file (name, bytes: the shard's files in order) whose bytes in `data` do not
    have the save's digest; None when all match."""
    at = 0
    for (name, size), d in zip(files, want, strict=True):
        if digest(data[at:at + size]) != d:
            return name
        at += size
    return None if at == data.nbytes else f"(the shard's {data.nbytes} bytes, {at} expected)"


class TierRun:
    """One process's share of a tiered run."""

    def __init__(self, run: Iterations) -> None:
        assert run.options.tier_plan is not None
        self.run, self.comm, self.o = run, run.comm, run.options
        self.tp: TierPlan = run.options.tier_plan
        self.spec = self.tp.spec
        self.proc = self.comm.rank
        self.node = self.tp.node_of[self.proc]
        self.dir = node_dir(self.spec.memory_dir, self.o.run_id, self.node)
        self.pages = memory_pages(self.spec.memory_dir) if self.spec.has("memory") else ""
        self.gen = PayloadGenerator(self.o.payload, self.o.seed)
        self.offset = self.comm.clock_offset_ns()
        self.records: list[dict[str, Any]] = []
        self.mine: list[Path] = []  # this process's own copies, by name
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
        make_dirs(self.spec.memory_dir, self.o.run_id, self.node)
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
        if not self.spec.keep:  # kept: a relaunch reads them (runner.tier_relaunch)
            remove_names(self.mine + (self.server.held if self.server is not None else []))
        if self.server is not None:
            self.server.close()
        if ok:
            self.comm.barrier()  # every process's names gone before the directories
        if not self.spec.keep:
            remove_dirs(self.spec.memory_dir, self.o.run_id, [self.node])

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
        self._drop(it - HELD_COPIES)
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
            self.run.sink.write(held_record(self.tp, self.o.run_id, it, self.files,
                                            self.expected[it]))
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

    def _drop(self, it: int) -> None:
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
        if self.reads is not None:  # onto the restore layout
            chunks = from_root(self.comm, self.expected_chunks.get(it))
            self._reshard_restart("process", it, set(), chunks)
            if self.spec.has("peer"):
                self._reshard_restart("node", it, {self.tp.nodes - 1}, chunks)
        else:
            expected = from_root(self.comm, self.expected.get(it))
            self._restart("process", it, set(), expected)
            if self.spec.has("peer"):
                self._restart("node", it, {self.tp.nodes - 1}, expected)
        if self.kept:
            lost = set(self.tp.group(self.tp.nodes - 1))
            if self.reads is not None:
                self._reshard_restart("group", self.kept, lost, from_root(
                    self.comm, self.expected_chunks.get(self.kept, {})))
            else:
                self._restart("group", self.kept, lost,
                              from_root(self.comm, self.expected.get(self.kept)))

    def _restart(self, scenario: str, it: int, lost: set[int],
                 expected: list[list[int]]) -> None:
        """One restart scenario, collectively: the state dropped (and a replaced node's
        copies), then the read back into memory allocated before the clock starts (a
        framework builds its model before it loads) interleaved with its baseline (a plain
        copy of the same bytes, or a plain transfer of them from the same holder), every
        process at once, in the order of restart_rounds; verified once all bytes are in. In
        the group scenario storage serves what no tier holds, beside the tiers."""
        held = it > self.o.iterations - HELD_COPIES  # the tiers still hold checkpoint `it`
        source = self.tp.serving_tier(self.proc, lost) if held else None
        if self.plain.nbytes < self.nbytes:  # the last restart took it as the state
            self.plain = touched(max(self.sizes))
            if self.server is not None:
                self.server.lend(self.plain)
        if self.state is None or self.state.nbytes != self.nbytes:
            # a restart onto another layout left its state in that layout: the plain
            # copy's source is one of this shard's size, written before the clock
            self.state = touched(self.nbytes)
        r = Restart(scenario, it, lost, source, self.plain[:self.nbytes], self.state)
        self.state = None  # the process restarts: its state is gone
        if self.node in lost:  # the node replaced: its copies are gone with it
            self._drop(it)
        if scenario == "group":  # storage is read cold, as after its own save
            self.run.evict(it)
        error: str | None = None
        fetching = source is not None and source[0] == "peer"
        for own, fetch_step in restart_rounds(scenario):
            self.comm.barrier()
            try:  # a collective part is entered after an error too: none waits for it
                self._round(fetch_step if fetching else own, fetch_step, r, error)
            except BaseException as exc:
                error = error or (str(exc) if isinstance(exc, RunFailed)
                                  else describe_error(exc)[1])
        # Every process's bytes in before any checks them: a digest taken beside another
        # process's read would take its CPU (2 cores, 8 processes), inside its seconds.
        self.comm.barrier()
        try:
            if error:
                raise RunFailed(error, "restore")
            t0 = now()
            if r.source is not None:
                self._verify(r.data, expected[self.proc], it, *r.source)
            rec = r.record(self.tp.node_of, self.offset, (now() - t0) / 1e9, self.o.verify)
            self.state, self.plain = r.data, np.empty(0, dtype=np.uint8)
            self.records.append({"type": "tier_restore", "scenario": scenario,
                                 "iteration": it, "process": self.proc, "node": self.node,
                                 **rec, "lost_nodes": sorted(lost)})
        except BaseException as exc:
            error = describe_error(exc)[1] if not isinstance(exc, RunFailed) else str(exc)
        self._agree(scenario, error)

    def _agree(self, scenario: str, error: str | None) -> None:
        """Collective: every process fails the restart when one did, with its error."""
        errors = self.comm.gather(error)
        first = next((e for e in errors if e), None) if errors is not None else None
        first = self.comm.bcast(first)
        if first:  # no partial restart is summarized as one: its records go
            self.records = [r for r in self.records if r.get("scenario") != scenario]
            raise RunFailed(f"restart ({scenario}): {first}", "restore")

    def _reshard_restart(self, scenario: str, it: int, lost: set[int],
                         expected: ChunkDigests) -> None:
        """A restart onto the restore layout (runner.tier_reshard), collectively as
        :meth:`_restart`: the state dropped (and a replaced node's copies), the memory for
        the restore ranks' chunks allocated, then the reads and their baselines in the
        order of RESTART_ORDER (the group's: GROUP_ORDER), every process at once; each
        chunk checked once all are in."""
        if self.plain.nbytes < max(self.sizes):  # the baselines' memory, before the clock
            self.plain = touched(max(self.sizes))
            if self.server is not None:
                self.server.lend(self.plain)
        self.state = None
        if self.node in lost:
            self._drop(it)
        r, given, error = self._reshard_plan(scenario, it, lost)
        if scenario == "group":  # storage is read cold, as after its own save
            self.run.evict(it)
        mover = Mover(self.proc, self.dir, self.plain, self.addresses, self.mpi)
        if self.mpi is not None:  # what each holder serves, off the clock
            mover.asked = everyone(self.comm, r.requests())
        for step in GROUP_ORDER if scenario == "group" else RESTART_ORDER:
            self.comm.barrier()
            t = now()
            try:
                if given is not None and step == "read":
                    self._group_read(mover, r, error, given, t)
                    continue
                gone = mover.move(r, step == "baseline", error)
                r.rounds[step].append((t, now()))
                if gone and not error:
                    raise RunFailed(f"checkpoint {it}: {self._shard()}: {gone[0]}", "missing")
            except BaseException as exc:
                error = error or (str(exc) if isinstance(exc, RunFailed)
                                  else describe_error(exc)[1])
        self.comm.barrier()  # every process's bytes in before any checks them
        try:
            if error:
                raise RunFailed(error, "restore")
            self._reshard_check(r, expected)
        except BaseException as exc:
            error = describe_error(exc)[1] if not isinstance(exc, RunFailed) else str(exc)
        self._agree(scenario, error)

    def _reshard_plan(self, scenario: str, it: int, lost: set[int]
                      ) -> tuple[ReshardRestart, StorageJobs | None, str | None]:
        """This process's sources and ranges (runner.tier_reshard), the group's storage
        jobs, or the error that stops it (it still serves others and enters every
        collective, with nothing of its own)."""
        assert self.reads is not None
        held = it > self.o.iterations - HELD_COPIES  # the tiers still hold checkpoint `it`
        try:
            r = plan_restart(scenario, it, lost, self.reads, self.tp, self.proc, self.dir,
                             self._missing_chunk(it, lost), held)
            return r, self._stored_jobs(r.stored, it) if scenario == "group" else None, None
        except BaseException as exc:
            error = str(exc) if isinstance(exc, RunFailed) else describe_error(exc)[1]
            r = ReshardRestart(scenario, it, lost, [], {}, np.empty(0, dtype=np.uint8))
            return r, ([], PlannedRestore([]), "") if scenario == "group" else None, error

    def _reshard_check(self, r: ReshardRestart, expected: ChunkDigests) -> None:
        """Every chunk the tiers served checked against the save's digest, then the
        record (none for a process the restore layout gives no rank)."""
        t0 = now()
        bad = first_bad_chunk(r, expected)
        if bad is not None:
            raise RunFailed(
                f"checkpoint {r.it}: {self._shard()}: file "
                f"{self.run.plan.file_paths[bad.file]} (the chunk at byte {bad.offset}) "
                f"from {r.sources[bad.owner].describe(self.tp)} differs from the "
                "save's digest", "verify")
        rec = reshard_record(r, self.tp, self.offset, (now() - t0) / 1e9,
                             self.restore_ranks, self.o.verify)
        self.state = r.data
        if r.reads or r.stored:
            self.records.append({"type": "tier_restore", "scenario": r.scenario,
                                 "iteration": r.it, "process": self.proc,
                                 "node": self.node, **rec, "lost_nodes": sorted(r.lost)})

    def _stored_jobs(self, stored: set[int], it: int) -> StorageJobs:
        """The group restart's storage reads onto the restore layout: the DCP load plan's
        ranged reads of the files whose owners no tier holds."""
        assert self.run.rplan is not None
        jobs = [j for j in restore_jobs(self.run.rplan, self.restore_ranks,
                                        self.run.checkpoint(it), self.run.saved_as(it),
                                        self.o.seed)
                if self.owners[j.index][0] in stored]
        return jobs, PlannedRestore(sorted({j.reader for j in jobs if j.reader is not None})), \
            "dcp plan"

    def _group_read(self, mover: Mover, r: ReshardRestart, error: str | None,
                    given: StorageJobs, t: int) -> None:
        """The group restart's read: the MPI fetches first (on this thread), then the
        node's own ranges and the TCP fetches beside the storage read of the chunks no
        tier holds, every process at once (runner.tier_storage). The read's clock: from
        `t` to the last of the two."""
        gone = mover.move(r, False, error, rest=False) if self.mpi is not None else []

        def serve() -> tuple[list[str], int]:
            if error:
                raise RunFailed(error, "restore")
            return mover.move(r, False, None, mpi=False), now()

        tier, r.part = beside_storage(self.run, r.it, serve if r.reads or error else None,
                                      given)
        gone += tier[0] if tier else []
        ends = [tier[1]] if tier else []
        if r.part.bytes:
            ends.append(r.part.end_ns)
        start = t if r.reads or not r.part.bytes else r.part.start_ns
        r.rounds["read"].append((start, max(ends, default=now())))
        if gone:
            raise RunFailed(f"checkpoint {r.it}: {self._shard()}: {gone[0]}", "missing")

    def _missing_chunk(self, it: int, lost: set[int]) -> Callable[[int, int], str]:
        def line(file: int, owner: int) -> str:
            return (f"checkpoint {it}: {self._shard()}: file {self.run.plan.file_paths[file]}"
                    f" (saved by process {owner}): no tier holds it after losing node(s) "
                    f"{sorted(lost)}")
        return line

    def _round(self, step: str, fetch_step: str, r: Restart, error: str | None) -> None:
        """One round of a restart, every process at once: the read into `r.data` or its
        baseline (`step`; the peer fetches' `fetch_step`), its clock readings kept in `r`.
        Its collective parts (an MPI exchange, the group's storage read) are entered after
        an `error` too, nothing else."""
        mpi = self.mpi is not None and self.spec.has("peer")
        t = now()
        got = self._mpi_fetch(r, plain=fetch_step == "baseline") if mpi else True
        if step == "read" and r.scenario == "group":
            def serve() -> tuple[int, int]:
                if error:
                    raise RunFailed(error, "restore")
                return self._tier_read(r, got, t)

            span, r.part = beside_storage(self.run, r.it, serve if r.source or error
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
            fetch(self.addresses[holder], self.proc, r.it, r.data, SOURCE)
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
            read_copy(self.dir / copy_name(self.proc, r.it), r.data)
        elif self.mpi is not None:
            if not got:
                raise RunFailed(self._missing(r.it, set(), holder), "missing")
        elif not fetch(self.addresses[holder], self.proc, r.it, r.data):
            raise RunFailed(self._missing(r.it, set(), holder), "missing")
        return t, now()

    def _mpi_fetch(self, r: Restart, plain: bool) -> bool:
        """Collective (MPI): every holder sends the replicas a restart fetches from it
        (`plain`: as many bytes of its plain-transfer memory, the baseline) into the
        fetching process's `r.data`; whether this process got its replica."""
        assert self.mpi is not None and self.server is not None
        held = r.it > self.o.iterations - HELD_COPIES
        sources = [self.tp.serving_tier(q, r.lost) if held else None
                   for q in range(len(self.sizes))]
        serves = [(q, self.plain if plain else self.server.path(q, r.it), self.sizes[q])
                  for q, src in enumerate(sources) if src == ("peer", self.proc)]
        mine = sources[self.proc]
        return self.mpi.fetch(serves, mine[1] if mine and mine[0] == "peer" else None,
                              r.data)

    def _shard(self) -> str:
        ranks = ",".join(str(r) for r in self.run.my_ranks)
        return f"the shard of process {self.proc} (plan ranks {ranks})"

    def _missing(self, it: int, lost: set[int], holder: int | None = None) -> str:
        where = (f"its holder process {holder} has no replica" if holder is not None else
                 f"no tier holds it after losing node(s) {sorted(lost)}")
        return f"checkpoint {it}: {self._shard()}: {where}"

    def _verify(self, data: np.ndarray, want: list[int], it: int, tier: str,
                holder: int) -> None:
        bad = first_mismatch(data, [(j.key.split("/", 1)[-1], j.size) for j in self.jobs], want)
        if bad is not None:
            where = ("its node's memory copy" if tier == "memory" else
                     f"the replica on node {self.tp.node_of[holder]} (process {holder})")
            raise RunFailed(f"checkpoint {it}: {self._shard()}: file {bad} from {where} "
                            "differs from the save's digest", "verify")

    def _write_records(self, error: ErrorRecord | None = None) -> None:
        gathered = self.comm.gather(self.records)
        if gathered is not None and self.run.sink is not None:
            self.run.sink.write_all([r for recs in gathered for r in recs])
            if error is not None:
                self.run.sink.write(error)
