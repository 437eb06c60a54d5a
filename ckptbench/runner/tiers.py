"""``--tiers``: every checkpoint to the memory and peer tiers, every N-th to storage, then
the restarts that read them, each measured and verified.

Per checkpoint, on every process (collectively, behind barriers so all run each step at
once, as a job's ranks do):

memory   a plain copy of the state into new memory (the physical limit), then the copy
         into the node's shared memory file (runner.tier_store): the blocking part, as
         async mode's snapshot is measured
peer     a plain transfer of the same bytes to the first holder over the same transport
         (discarded there), then the shard to each of its k holders (runner.tier_peer),
         timed until every holder acknowledged the complete replica
storage  every --storage-every-th checkpoint: the ordinary save and restore (driver)

The copies of the checkpoint before the last two are removed as a new one is held. After
the last checkpoint, the restarts (each process's state dropped first):

process  a process restarts on its intact node: each reads its node's memory copy
node     the last node is replaced: its memory copies and the replicas it held are
         removed, its processes fetch their shards from surviving holders; the others
         read their memory copies

Every byte restored is checked against the save's digests (kept by process 0, as a
manifest is); a mismatch or a shard no tier holds is one line naming it.
"""

from __future__ import annotations

import socket
import statistics
import threading
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptbench.errors import RunFailed, SpecError, describe_error
from ckptbench.formats.base import file_jobs, now
from ckptbench.payload import PayloadGenerator, digest
from ckptbench.plan import Plan
from ckptbench.plan.tiers import HELD_COPIES, TierPlan, plan_tiers
from ckptbench.records import ErrorRecord
from ckptbench.runner.options import RunOptions
from ckptbench.runner.scheduler import slurm_node
from ckptbench.runner.tier_peer import PUT, SINK, SOURCE, PeerServer, fetch, send
from ckptbench.runner.tier_store import (
    PreparedCopy,
    check_memory,
    copy_name,
    make_dirs,
    node_dir,
    read_copy,
    remove_dirs,
    remove_names,
)

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations


# A restart's reads interleaved with their baselines (A B B A A B): a machine whose load
# drifts slows both alike; the records keep every round and their medians.
RESTART_ORDER = ("baseline", "read", "read", "baseline", "baseline", "read")


def run_at_once(calls: list[Callable[[], None]]) -> None:
    """Run `calls` at once; raise the first error."""
    errors: list[BaseException] = []

    def wrap(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(c,), daemon=True) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def touched(nbytes: int) -> np.ndarray:
    """`nbytes` of memory with every page faulted in (off the clock)."""
    out = np.empty(nbytes, dtype=np.uint8)
    out.fill(1)
    return out


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
        self.gen = PayloadGenerator(self.o.payload, self.o.seed)
        self.offset = self.comm.clock_offset_ns()
        self.records: list[dict[str, Any]] = []
        self.mine: list[Path] = []  # this process's own copies, by name
        self.expected: dict[int, list[list[int]]] = {}  # process 0: it -> digests per process
        self.server: PeerServer | None = None
        self.addresses: list[tuple[str, int]] = []
        self.transport = ""

    # --- the run ---
    def run_all(self) -> None:
        ok = False
        try:
            self._start()
            for it in range(1, self.o.iterations + 1):
                self._checkpoint(it)
                if self.tp.stores(it):
                    self.run.claim(it)
                    self.run.save(it)
                    self.run.restore(it)  # the storage restart: measured, verified, removed
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

    def _start(self) -> None:
        # Reached at the machine's name: a node is the scheduler's (comm.host()), and the
        # nodes Slurm emulates on one machine have names no resolver knows.
        machine = socket.gethostname()
        loopback = len(set(self.comm.bcast(self.comm.gather(machine)))) == 1
        make_dirs(self.spec.memory_dir, self.o.run_id, self.node)
        if self.spec.has("peer"):
            self.server = PeerServer(self.dir, "127.0.0.1" if loopback else "0.0.0.0")
            me = ("127.0.0.1" if loopback else machine, self.server.port)
            self.addresses = self.comm.bcast(self.comm.gather(me))
            self.transport = "tcp-loopback" if loopback else "tcp"
        self.jobs = file_jobs(self.run.plan, self.run.my_ranks, "tiers", 1, self.o.seed)
        self.nbytes = sum(j.size for j in self.jobs)
        self.sizes: list[int] = self.comm.bcast(self.comm.gather(self.nbytes))
        self.state: np.ndarray | None = touched(self.nbytes)  # as a training state is
        # the plain copy's destination; the holder's plain transfers use it too
        self.plain = touched(max(self.sizes))
        if self.server is not None:
            self.server.lend(self.plain)

    def _stop(self, ok: bool) -> None:
        remove_names(self.mine)
        if self.server is not None:
            remove_names(self.server.held)
            self.server.close()
        if ok:
            self.comm.barrier()  # every process's names gone before the directories
        remove_dirs(self.spec.memory_dir, self.o.run_id, [self.node])

    # --- one checkpoint ---
    def _fill(self, it: int) -> list[int]:
        """The state of checkpoint `it` (training changed every byte), its digests per
        job; off the clock."""
        assert self.state is not None
        jobs = file_jobs(self.run.plan, self.run.my_ranks, "tiers", it, self.o.seed)
        digests, at = [], 0
        for job in jobs:
            part = self.state[at:at + job.size]
            self.gen.fill(job.base, job.regions, 0, part)
            digests.append(digest(part))
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
        digests = self._fill(it)
        assert self.state is not None
        state = self.state
        gathered = self.comm.gather(digests)
        if gathered is not None:
            self.expected[it] = gathered
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
            copy.release()
            self._record("memory", it, (t2, t3), (t1 - t0) / 1e9, "plain copy",
                         where=self.spec.memory_dir)
        if self.spec.has("peer"):
            assert self.server is not None
            holders = self.tp.holders(self.proc)
            for src in self.tp.held_for(self.proc):  # off the clock
                self.server.prepare(src, it, self.sizes[src])
            self.comm.barrier()
            t0 = now()
            send(self.addresses[holders[0]], SINK, self.proc, it, state)
            t1 = now()
            self.comm.barrier()
            t2 = now()
            run_at_once([partial(send, self.addresses[h], PUT, self.proc, it, state)
                      for h in holders])
            t3 = now()
            self._record("peer", it, (t2, t3), (t1 - t0) / 1e9, "plain transfer",
                         transport=self.transport, holders=holders,
                         replicas=len(holders))
        self.comm.barrier()  # every copy of `it` held: the oldest is let go
        self._drop(it - HELD_COPIES)

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
        expected = self.comm.bcast(self.expected.get(it))
        self._restart("process", it, set(), expected)
        if self.spec.has("peer"):
            self._restart("node", it, {self.tp.nodes - 1}, expected)

    def _restart(self, scenario: str, it: int, lost: set[int],
                 expected: list[list[int]]) -> None:
        """One restart scenario, collectively: the state dropped (and a replaced node's
        copies), then the read back into memory allocated before the clock starts (a
        framework builds its model before it loads) interleaved with its baseline (a plain
        copy of the same bytes, or a plain transfer of them from the same holder), every
        process at once, in RESTART_ORDER; then verified."""
        error: str | None = None
        source = self.tp.serving_tier(self.proc, lost)
        if self.plain.nbytes < self.nbytes:  # the last restart took it as the state
            self.plain = touched(max(self.sizes))
            if self.server is not None:
                self.server.lend(self.plain)
        data = self.plain[:self.nbytes]  # the baseline's destination, then the restore's
        state, self.state = self.state, None  # the process restarts: its state is gone
        if self.node in lost:  # the node replaced: its copies are gone with it
            self._drop(it)
        spans: dict[str, list[tuple[int, int]]] = {"read": [], "baseline": []}
        for step in RESTART_ORDER:
            self.comm.barrier()
            if error:
                continue
            try:
                t = now()
                self._restart_step(step, source, it, lost, data, state)
                spans[step].append((t, now()))
            except BaseException as exc:
                error = str(exc) if isinstance(exc, RunFailed) else describe_error(exc)[1]
        # Every process's bytes in before any checks them: a digest taken beside another
        # process's read would take its CPU (2 cores, 8 processes), inside its seconds.
        self.comm.barrier()
        try:
            if error:
                raise RunFailed(error, "restore")
            assert source is not None
            tier, holder = source
            t2 = now()
            self._verify(data, expected[self.proc], it, tier, holder)
            t3 = now()
            self.state, self.plain = data, np.empty(0, dtype=np.uint8)
            reads = [(b - a) / 1e9 for a, b in spans["read"]]
            bases = [(b - a) / 1e9 for a, b in spans["baseline"]]
            self.records.append({
                "type": "tier_restore", "scenario": scenario, "iteration": it,
                "process": self.proc, "node": self.node, "tier": tier,
                "from_node": self.tp.node_of[holder], "from_process": holder,
                "bytes": len(data), "start_ns": spans["read"][0][0] + self.offset,
                "end_ns": spans["read"][0][1] + self.offset,
                "seconds": statistics.median(reads), "rounds_s": reads,
                "verify_s": (t3 - t2) / 1e9, "verified": True,
                "baseline_s": statistics.median(bases), "baseline_rounds_s": bases,
                "baseline": "plain copy" if tier == "memory" else "plain transfer",
                "lost_nodes": sorted(lost)})
        except BaseException as exc:
            error = describe_error(exc)[1] if not isinstance(exc, RunFailed) else str(exc)
        errors = self.comm.gather(error)
        first = next((e for e in errors if e), None) if errors is not None else None
        first = self.comm.bcast(first)
        if first:  # no partial restart is summarized as one: its records go
            self.records = [r for r in self.records if r.get("scenario") != scenario]
            raise RunFailed(f"restart ({scenario}): {first}", "restore")

    def _restart_step(self, step: str, source: tuple[str, int] | None, it: int,
                      lost: set[int], data: np.ndarray, state: np.ndarray | None) -> None:
        """One read of a restart (into `data`) or its baseline."""
        if source is None:
            raise RunFailed(self._missing(it, lost), "missing")
        tier, holder = source
        if step == "baseline" and tier == "peer":
            fetch(self.addresses[holder], self.proc, it, data, SOURCE)
        elif step == "baseline" and state is not None:
            np.copyto(data, state)
        elif step == "read" and tier == "memory":
            read_copy(self.dir / copy_name(self.proc, it), data)
        elif step == "read" and not fetch(self.addresses[holder], self.proc, it, data):
            raise RunFailed(self._missing(it, lost, holder), "missing")

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


def place_tiers(options: RunOptions, plan: Plan, groups: list[list[int]], hosts: list[str]
                ) -> tuple[RunOptions, SpecError | None]:
    """The options with the tiers placed on the run's processes (plan.tiers) and their
    copies checked against the memory budget; or the one-line refusal."""
    try:
        tplan = plan_tiers(options.tiers, hosts, "slurm nodes" if slurm_node() else
                           "launcher hosts")
        if tplan is None:
            return options, None
        check_memory(tplan, [plan.bytes_of_ranks(g) for g in groups], hosts)
    except SpecError as exc:
        return options, exc
    return replace(options, tier_plan=tplan), None
