"""``--mode async --tiers peer``: each checkpoint's snapshot replicated to peer nodes in the
background, while the training loop runs (and the storage persist with it).

Once every process holds its snapshot in staging (async mode's blocking part), a thread
of each process sends the snapshot to its K holders on other nodes (runner.tier_peer:
received into the replica file's mapping, held once complete) while the loop steps on;
the steps that ran beside it show its interference next to the loop's baseline steps.
Before each snapshot (off the loop's clock, with the refresh) every process times a plain
transfer of the same bytes to its first holder: the reference. A checkpoint's snapshot is
not overwritten while its replication runs: the next checkpoint waits for it (counted as
its wait, as a persist in flight is). After the loop, the node restart: the last node is
replaced, its processes fetch their shards of the last checkpoint from their first
surviving holders (a plain transfer from the same holder first), and every byte is checked
against the digests the loop took of the state.

The transport is the launcher's (runner.tiers): under mpirun/srun the replicas go by MPI
point-to-point and no socket is opened. mpi4py runs MPI funneled here (only the loop's
thread calls it), so, as async checkpointing stacks on MPI do, the sends and receives are
posted when the checkpoint is taken and the loop drives them on at its step boundaries
(``MPI_Testall``), where it also sees them complete. Between local processes a thread per
checkpoint sends over TCP, on sockets of its own.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats.base import FileJob, everyone, now
from ckptbench.payload import ChunkHasher
from ckptbench.plan.tiers import HELD_COPIES, TierPlan
from ckptbench.runner.comm import Comm
from ckptbench.runner.tier_mpi import TAG_PLAIN, TAG_REPLICA
from ckptbench.runner.tier_peer import GET, PUT, SINK, SOURCE, fetch, open_links, send, send_all
from ckptbench.runner.tier_store import (
    PreparedCopy,
    make_run_dir,
    remove_names,
    touched,
)


class _Posted:
    """One checkpoint's replication posted on MPI: its requests and the replicas they fill."""

    def __init__(self, it: int, t0: int, reqs: list[Any], copies: list[PreparedCopy],
                 baseline_s: float) -> None:
        self.it, self.t0, self.reqs, self.copies = it, t0, reqs, copies
        self.baseline_s = baseline_s


class BackgroundReplication:
    """One process's peer tier in an async run (collective calls on the loop's thread)."""

    def __init__(self, comm: Comm, tplan: TierPlan, run_id: str, nbytes: int,
                 offset_ns: int) -> None:
        self.comm, self.tp, self.run_id, self.offset = comm, tplan, run_id, offset_ns
        self.proc = comm.rank
        self.node = tplan.node_of[self.proc]
        self.nbytes = nbytes
        self.run_dir = make_run_dir(comm, tplan, run_id)  # collective (runner.tier_store)
        self.server, self.mpi, self.addresses, self.transport = open_links(
            comm, tplan, self.run_dir.node(self.node))
        self.sizes: list[int] = everyone(comm, nbytes)
        self.plain = touched(max(self.sizes))  # the plain transfers' memory, both ways
        self.server.lend(self.plain)
        # under MPI, a plain transfer's destination per sender (written off the clock)
        self.sinks = {p: touched(self.sizes[p]) for p in tplan.held_for(self.proc)
                      if tplan.holders(p)[0] == self.proc} if self.mpi is not None else {}
        self.posted: _Posted | None = None
        self.holders = tplan.holders(self.proc)
        self.records: list[dict[str, Any]] = []
        self.thread: threading.Thread | None = None
        self.error: str | None = None

    def refresh(self, it: int, snapshot: np.ndarray) -> float:
        """Off the loop's clock, before checkpoint `it`'s snapshot: the replicas of the
        checkpoint before the last two let go, `it`'s allocated, and the plain transfer
        of the same bytes to the first holder timed (seconds)."""
        self._drop(it - HELD_COPIES)
        for src in self.tp.held_for(self.proc):
            self.server.prepare(src, it, self.sizes[src])
        t0 = now()
        if self.mpi is not None:  # collective: every process sends and sinks at once
            self.mpi.exchange([(self.holders[0], snapshot)], list(self.sinks.items()),
                              TAG_PLAIN)
        else:
            send(self.addresses[self.holders[0]], SINK, self.proc, it, snapshot)
        return (now() - t0) / 1e9

    def start(self, it: int, snapshot: np.ndarray, baseline_s: float) -> None:
        """The snapshot of checkpoint `it` to every holder at once, in the background
        (collective under MPI: every process posts its sends and its receives)."""
        if self.mpi is not None:
            t0 = now()
            copies = {p: self.server.take(p, it, self.sizes[p])
                      for p in self.tp.held_for(self.proc)}
            reqs = self.mpi.post([(h, snapshot) for h in self.holders],
                                 [(p, c.view) for p, c in copies.items()], TAG_REPLICA)
            self.posted = _Posted(it, t0, reqs, list(copies.values()), baseline_s)
            return

        def work() -> None:
            t0 = now()
            try:
                send_all([self.addresses[h] for h in self.holders], PUT, self.proc, it,
                         snapshot)
            except BaseException as exc:
                self.error = f"checkpoint {it}: replication: {describe_error(exc)[1]}"
                return
            self._record(it, t0, now(), baseline_s, "thread")

        self.thread = threading.Thread(target=work, name=f"replicate-{it}", daemon=True)
        self.thread.start()

    def _record(self, it: int, t0: int, t1: int, baseline_s: float, progress: str) -> None:
        self.records.append({
            "type": "tier", "tier": "peer", "iteration": it, "process": self.proc,
            "node": self.node, "bytes": self.nbytes, "start_ns": t0 + self.offset,
            "end_ns": t1 + self.offset, "blocking_s": 0.0,
            "replication_s": (t1 - t0) / 1e9, "background": True,
            "baseline_s": baseline_s, "baseline": "plain transfer",
            "transport": self.transport, "progress": progress, "holders": self.holders,
            "replicas": len(self.holders)})

    def progress(self) -> None:
        """At a step boundary of the loop: the replication posted on MPI driven on, and
        its replicas held once every request has completed (nothing for TCP)."""
        if self.posted is not None and self.mpi is not None and self.mpi.done(self.posted.reqs):
            self._finish(now())

    def busy(self) -> bool:
        """Whether a replication is still in flight."""
        return self.posted is not None or (self.thread is not None and self.thread.is_alive())

    def _finish(self, t1: int) -> None:
        posted, self.posted = self.posted, None
        assert posted is not None
        try:
            for c in posted.copies:
                c.commit()  # held only once every byte is in
        except BaseException as exc:
            self.error = f"checkpoint {posted.it}: replication: {describe_error(exc)[1]}"
        finally:
            for c in posted.copies:
                c.release()
        if self.error is None:
            self._record(posted.it, posted.t0, t1, posted.baseline_s, "step boundaries")

    def wait(self) -> None:
        """The replication in flight done (raise when it failed)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.posted is not None and self.mpi is not None:
            self.mpi.MPI.Request.Waitall(self.posted.reqs)
            self._finish(now())
        if self.error:
            raise RunFailed(self.error, "peer")

    def _drop(self, it: int) -> None:
        if it < 1:
            return
        gone = [p for p in self.server.held if p.name.endswith(f"-ckpt{it}.bin")]
        remove_names(gone)
        self.server.held = [p for p in self.server.held if p not in gone]

    def restart(self, it: int, jobs: list[FileJob], offsets: dict[int, int],
                expected: dict[int, list[int]]) -> None:
        """Collectively: the node restart of checkpoint `it`: the last node is replaced,
        its processes fetch their shards from their first surviving holders, verified (the
        other processes keep their state: without a memory tier a restart of theirs would
        find no copy on their own node)."""
        lost = {self.tp.nodes - 1}
        restarted = self.node in lost
        source = self.tp.serving_tier(self.proc, lost) if restarted else None
        error: str | None = None
        data = self.plain[:self.nbytes]
        self.comm.barrier()
        base = t0 = t1 = 0
        try:
            t = now()
            self._get(it, lost, source, data, plain=True)  # collective under MPI
            base = now() - t
            if restarted and source is None:
                raise RunFailed(f"checkpoint {it}: the shard of process {self.proc}: no tier "
                                f"holds it after losing node(s) {sorted(lost)}", "missing")
        except BaseException as exc:
            error = str(exc) if isinstance(exc, RunFailed) else describe_error(exc)[1]
        self.comm.barrier()
        if self.mpi is not None or (error is None and source is not None):
            try:
                t0 = now()
                got = self._get(it, lost, source, data, plain=False)
                t1 = now()
                if error is None and source is not None and not got:
                    raise RunFailed(f"checkpoint {it}: the shard of process {self.proc}: its "
                                    f"holder process {source[1]} has no replica", "missing")
            except BaseException as exc:
                error = error or (str(exc) if isinstance(exc, RunFailed)
                                  else describe_error(exc)[1])
        self.comm.barrier()  # every process's bytes in before any checks them
        if error is None and source is not None:
            t2 = now()
            error = _check(data, jobs, offsets, expected, self.proc, self.tp, source[1], it)
            if error is None:
                self.records.append({
                    "type": "tier_restore", "scenario": "node", "iteration": it,
                    "process": self.proc, "node": self.node, "tier": "peer",
                    "from_node": self.tp.node_of[source[1]], "from_process": source[1],
                    "bytes": self.nbytes, "start_ns": t0 + self.offset,
                    "end_ns": t1 + self.offset, "seconds": (t1 - t0) / 1e9,
                    "verify_s": (now() - t2) / 1e9, "verified": True,
                    "baseline_s": base / 1e9, "baseline": "plain transfer",
                    "lost_nodes": sorted(lost)})
        errors = self.comm.gather(error)
        first = self.comm.bcast(next((e for e in errors if e), None) if errors else None)
        if first:
            self.records = [r for r in self.records if r["type"] != "tier_restore"]
            raise RunFailed(f"restart (node): {first}", "restore")

    def _get(self, it: int, lost: set[int], source: tuple[str, int] | None,
             data: np.ndarray, plain: bool) -> bool:
        """This process's shard of checkpoint `it` from its holder `source` into `data`
        (`plain`: as many bytes of the holder's plain-transfer memory, the baseline);
        whether it came. Collective under MPI: every holder serves the processes of the
        `lost` nodes whose first surviving holder it is."""
        if self.mpi is not None:
            serves = [(q, self.plain if plain else self.server.path(q, it), self.sizes[q])
                      for q in range(len(self.sizes)) if self.tp.node_of[q] in lost
                      and self.tp.serving_tier(q, lost) == ("peer", self.proc)]
            return self.mpi.fetch(serves, source[1] if source else None, data)
        if source is None:
            return False
        return fetch(self.addresses[source[1]], self.proc, it, data, SOURCE if plain else GET)

    def close(self, ok: bool) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.posted is not None:  # a failed run: its receives may never complete
            for c in self.posted.copies:
                c.abandon()
            self.posted = None
        refused: OSError | None = None
        try:
            remove_names(self.server.held)
        except OSError as exc:  # the node's directory is not the one made: left alone
            refused = exc
        self.server.close()
        if ok:
            self.comm.barrier()  # every process's names gone before the directories
        self.run_dir.remove_node(self.node)
        if ok and refused is not None:
            raise refused


def _check(data: np.ndarray, jobs: list[FileJob], offsets: dict[int, int],
           expected: dict[int, list[int]], proc: int, tp: TierPlan, holder: int, it: int
           ) -> str | None:
    """The first chunk of a fetched replica whose digest differs from the state's, named;
    None when every chunk matches."""
    for job in jobs:
        hasher = ChunkHasher(job.regions)
        at = offsets[job.index]
        hasher.update(0, data[at:at + job.size])
        for region, got, want in zip(job.regions, hasher.digests(), expected[job.index],
                                     strict=True):
            if got != want:
                return (f"checkpoint {it}: the shard of process {proc}: chunk {region.key} in "
                        f"{job.key} from the replica on node {tp.node_of[holder]} (process "
                        f"{holder}) differs from the state's digest")
    return None
