"""``--mode async``: checkpoints taken from a synthetic training loop, measured.

Every process holds its plan ranks' state in "device" memory (runner.staging) and runs a
training loop whose step does real work for ``--step-seconds`` (runner.training); every
``--steps-per-checkpoint`` steps it checkpoints:

blocking  wait until the previous checkpoint is durable (one persist in flight), then
          copy the state into staging memory, then wait for every process's copy: the
          loop stands still for all of it (the wait is recorded apart)
persist   background threads write the snapshot through the format and the backend
          (the format's payload source is the snapshot), durably, as a sync save does;
          once every process is done, process 0 commits the manifest atomically in a
          background thread of its own (driver's commit: the same manifest and records);
          the stall watch is armed around it as around a sync save

Only the loop's thread talks to the other processes (under MPI it is the only one
allowed to): the loop's per-layer collective carries each process's finished persist
to process 0 and the commit's outcome back. A failed persist leaves no manifest and
stops the loop with one line on every process; the checkpoints before it stay durable.

The same loop also runs without checkpoints for the same number of steps (the
baseline, half before and half after), so the interference is measured side by side.
Each checkpoint's directory is claimed (created exclusively, runner.driver) before its
snapshot, off the clock. After the loop every checkpoint is evicted, restored and
verified, then removed by name unless --keep, as in sync mode (driver's restore). The
records keep times only; the report step makes the figures.
"""

from __future__ import annotations

import importlib.util
import statistics
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptbench.errors import RunFailed, SpecError, VerificationError, describe_error
from ckptbench.formats import open_format
from ckptbench.formats.base import (
    FileJob,
    ThreadResult,
    file_jobs,
    first_error,
    now,
)
from ckptbench.plan import Plan
from ckptbench.records import (
    CheckpointRecord,
    LoopRecord,
    RankRecord,
    Record,
    SavePhaseRecord,
    StepsRecord,
)
from ckptbench.runner.async_peer import BackgroundReplication
from ckptbench.runner.comm import Comm, T
from ckptbench.runner.decision import Decision
from ckptbench.runner.options import RunOptions
from ckptbench.runner.phase_report import PhaseReport
from ckptbench.runner.staging import (
    FullSnapshot,
    PiecewiseSnapshot,
    open_state,
    staging_bytes,
    state_bytes,
)
from ckptbench.runner.training import Kernel, Schedule, open_kernel, schedule, unit_seconds

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations

POLL_S = 0.005  # between the collectives of a loop waiting for a persist


def check_async(plan: Plan, options: RunOptions) -> None:
    """Refuse, in one line before anything runs, what --mode async cannot do."""
    if options.mode != "async":
        return
    if options.format != "raw":
        raise SpecError(f"--mode async persists with --format raw (not {options.format}); "
                        "allowed: --format raw")
    if plan.workload.checkpoint.files == "shared":
        raise SpecError("--mode async: [checkpoint] files = 'shared' needs the file created "
                        "before every rank writes, a collective the background persist cannot "
                        "make; allowed: dcp, per-chunk, per-rank, megatron")
    if options.loop.device == "cuda" and importlib.util.find_spec("torch") is None:
        raise SpecError("--state-device cuda needs torch with CUDA (pip install "
                        "'ckptbench[torch]'); allowed here: auto, host")
    staging = options.loop.staging_bytes
    if options.tiers.has("peer") and staging:
        raise SpecError(f"--staging-memory {staging} B with --tiers peer: the replicas are sent "
                        "from the whole snapshot in staging; allowed: --staging-memory state")
    if 0 < staging < options.block_size:
        raise SpecError(f"--staging-memory {staging} B holds no block of --block-size "
                        f"{options.block_size} B; allowed: as much as the state, or at least "
                        "one block")


KERNEL_BYTES = 3 * 8 << 20  # the step's arrays (training.MemoryKernel; matmul's are smaller)


def loop_memory_bytes(plan: Plan, ranks: list[int], options: RunOptions) -> tuple[int, int]:
    """(state, staging): the host memory one process running plan ranks `ranks` holds in
    --mode async besides its I/O buffers (0, 0 in sync mode). The state is on the host
    unless asked for on the GPU (then a bounce buffer of its largest job is); staging is
    --staging-memory, at most the state; the step's arrays go with the state."""
    if options.mode != "async":
        return 0, 0
    jobs = file_jobs(plan, ranks, "state", 1, options.seed)
    state = state_bytes(jobs)
    on_host = max((j.size for j in jobs), default=0) if options.loop.device == "cuda" else state
    return on_host + KERNEL_BYTES, staging_bytes(state, options.loop.staging_bytes)


class _Alone:
    """The format's group in a background thread: no collectives there."""

    def __init__(self, comm: Comm) -> None:
        self.rank, self.size, self._host = comm.rank, comm.size, comm.host()

    def barrier(self) -> None:
        return None

    def gather(self, obj: T) -> list[T] | None:
        raise RuntimeError("a background persist makes no collectives")

    def bcast(self, obj: T) -> T:
        raise RuntimeError("a background persist makes no collectives")

    def host(self) -> str:
        return self._host


class _Collect:
    """A sink keeping the commit's records for the loop's thread to forward."""

    def __init__(self) -> None:
        self.records: list[Record | dict[str, Any]] = []

    def write(self, record: Record | dict[str, Any]) -> None:
        self.records.append(record)

    def write_all(self, records: Iterable[Record | dict[str, Any]]) -> None:
        self.records.extend(records)

    def flush(self) -> None:
        return None


@dataclass
class _Commit:
    thread: threading.Thread | None = None
    sink: _Collect = field(default_factory=_Collect)
    decision: Decision | None = None  # set last, when the commit is over


def _check_snapshot(results: list[ThreadResult], jobs: list[FileJob],
                    expected: dict[int, list[int]]) -> VerificationError | None:
    """The bytes persisted (their digests, taken as they were written) against the state
    the loop held: a torn or misplaced snapshot fails the checkpoint."""
    got = {f: d for r in results for f, d in r.digests.items()}
    for job in jobs:
        have = got.get(job.index, [])
        for k, (region, want) in enumerate(zip(job.regions, expected[job.index], strict=True)):
            if k >= len(have) or have[k] != want:
                return VerificationError(f"chunk {region.key} in {job.key}: the persisted "
                                         "snapshot differs from the training state")
    return None


def _left(it: int) -> str:
    """What a failed checkpoint `it` leaves: no manifest, the ones before it durable."""
    last = f"checkpoint {it - 1} is the last durable one" if it > 1 else "no checkpoint is durable"
    return f"no manifest written; {last}"


class AsyncLoop:
    """One process's share of an async run (every process runs it collectively)."""

    def __init__(self, run: Iterations) -> None:
        check_async(run.plan, run.options)
        self.driver = run  # the driver's claim, commit and restore
        self.plan, self.my_ranks, self.backend, self.comm = (run.plan, run.my_ranks,
                                                             run.backend, run.comm)
        self.o, self.sink = run.options, run.sink
        self.root = self.comm.rank == 0
        self.offset = self.comm.clock_offset_ns()
        # its payload source is replaced by snapshots (Format.source)
        self.fmt = open_format(self.o.format, self.plan, self.my_ranks, self.backend,
                               _Alone(self.comm), self.o.format_options(), run.moved)
        self.lock = threading.Lock()
        self.outbox: list[tuple[int, PhaseReport]] = []  # persists done, not yet sent
        self.final: dict[int, Decision] = {}  # iteration -> commit outcome
        self.pending: dict[int, list[PhaseReport | None]] = {}  # process 0: reports so far
        self.commits: dict[int, _Commit] = {}  # process 0: commits running
        self.timings: list[dict[str, Any]] = []  # this process's checkpoints
        self.peers: BackgroundReplication | None = None  # --tiers peer (runner.async_peer)

    # --- the loop ---
    def run(self) -> None:
        jobs = self.driver.jobs(1)
        self.state = open_state(self.o.loop.device, jobs, self.comm.rank)
        staging = staging_bytes(self.state.nbytes, self.o.loop.staging_bytes)
        self.state.allocate_staging(staging)
        self.full = staging >= self.state.nbytes
        tplan = self.o.tier_plan
        if tplan is None or not tplan.spec.has("peer"):
            self._run(jobs, staging)
            return
        self.peers = BackgroundReplication(self.comm, tplan, self.o.run_id, self.state.nbytes,
                                           self.offset)
        ok = False
        try:
            self._run(jobs, staging)
            ok = True
        finally:
            self.peers.close(ok)

    def _run(self, jobs: list[FileJob], staging: int) -> None:
        lo = self.o.loop
        self.expected = self.state.load(jobs, self.fmt.gen)
        copy_bw = self.state.copy_bandwidth(staging)
        kernel = open_kernel(lo.kernel, self.state.kind, self.state.device)
        self.comm.barrier()  # every process calibrates at once, as they will step
        sched = schedule(self._agree(unit_seconds(kernel)), lo.step_seconds)
        total = (self.o.iterations + 1) * lo.steps_per_checkpoint
        self._step(kernel, sched)  # warm-up, not recorded
        self.comm.barrier()
        # The baseline is split around the loop with checkpoints, so a machine whose
        # load drifts slows both alike (to first order).
        first = self._loop(kernel, sched, total // 2, checkpoints=False)
        self.comm.barrier()
        steps = self._loop(kernel, sched, total, checkpoints=True)
        while len(self.final) < self.o.iterations:  # the last persist
            time.sleep(POLL_S)
            self._sync()
        if self.peers is not None:  # and the last replication
            self.peers.wait()
        self.comm.barrier()
        second = self._loop(kernel, sched, total - total // 2, checkpoints=False)
        baseline = (first[0] + second[0], first[1] + second[1])
        facts = LoopRecord(self.comm.rank, list(self.my_ranks), self.comm.host(), self.state.kind,
                           self.state.payload_bytes, staging,
                           "full" if self.full else "piecewise", copy_bw, kernel.name,
                           sched.to_dict())
        self._write_records(facts, baseline, steps)
        if self.peers is not None:
            self._peer_restart()
        for it in range(1, self.o.iterations + 1):  # restored, verified, then removed
            self.driver.restore(it)

    def _agree(self, value: float) -> float:
        """Collective: the median of every process's value."""
        values = self.comm.gather(value)
        return float(self.comm.bcast(statistics.median(values) if values else value))

    def _step(self, kernel: Kernel, sched: Schedule) -> None:
        for _ in range(sched.layers):
            kernel.run(sched.units)
            self._sync()
            if self.peers is not None:  # a replication posted on MPI driven on
                self.peers.progress()

    def _loop(self, kernel: Kernel, sched: Schedule, total: int, checkpoints: bool
              ) -> tuple[list[int], list[float]]:
        spc = self.o.loop.steps_per_checkpoint
        starts: list[int] = []
        seconds: list[float] = []
        for s in range(1, total + 1):
            t0 = now()
            self._step(kernel, sched)
            starts.append(t0 + self.offset)
            seconds.append((now() - t0) / 1e9)
            if checkpoints and s % spc == 0 and s // spc <= self.o.iterations:
                self._checkpoint(s // spc)
        return starts, seconds

    def _checkpoint(self, it: int) -> None:
        t0 = now()
        waited = it > 1 and it - 1 not in self.final
        while it > 1 and it - 1 not in self.final:  # one persist in flight: blocking too
            time.sleep(POLL_S)
            self._sync()
        if self.peers is not None:  # and one replication: its snapshot is still read
            waited = waited or self.peers.busy()
            self.peers.wait()
        t1 = now()
        # Off the clock: the checkpoint's directory is claimed, the persist's threads are
        # set up (they read each piece of the snapshot once it is copied), the state takes
        # the checkpoint's own bytes (training changed every one since the last), and one
        # plain copy is timed: the physical limit, as busy as the machine is now.
        try:
            self.driver.claim(it)  # the checkpoint's own, new directory
        except RunFailed as exc:
            raise RunFailed(f"checkpoint {it}: its directory could not be made: {exc} "
                            f"({_left(it)})", exc.kind) from None
        jobs = self.driver.jobs(it)
        snapshot = FullSnapshot(self.state) if self.full else PiecewiseSnapshot(self.state)
        self.fmt.source = snapshot
        self._persist(it, jobs, snapshot)
        if it > 1:
            self.expected = self.state.load(jobs, self.fmt.gen)
        bandwidth = self.state.copy_bandwidth(len(self.state.staging), 1)
        limit = self.state.payload_bytes / bandwidth if bandwidth else 0.0
        snap = self.state.staging[:self.state.nbytes]
        transfer_s = self.peers.refresh(it, snap) if self.peers is not None else 0.0
        self.comm.barrier()
        t2 = now()
        snapshot.take()
        t3 = now()
        self.comm.barrier()  # the loop resumes once every process has its snapshot
        t4 = now()
        if self.peers is not None:  # replicated while the loop runs on
            self.peers.start(it, snap, transfer_s)
        self.timings.append({
            "iteration": it, "start_ns": t0 + self.offset,
            "wait_s": (t1 - t0) / 1e9 if waited else 0.0,
            "refresh_s": (t2 - t1) / 1e9, "limit_s": limit, "snapshot_s": (t3 - t2) / 1e9,
            "blocking_s": (t1 - t0 + t4 - t2) / 1e9, "snapshot_ns": t2 + self.offset,
            "resume_ns": t4 + self.offset})

    def _persist(self, it: int, jobs: list[FileJob],
                 snapshot: FullSnapshot | PiecewiseSnapshot) -> None:
        def work() -> None:
            results: list[ThreadResult] = []
            try:
                with self.driver.watched.watching(f"the persist of {self.plan.checkpoint_name(it)}"):
                    results = self.fmt.save(jobs)  # returns after the snapshot was taken,
                err = first_error(results) or _check_snapshot(  # so after the state's load
                    results, jobs, self.expected)
            except BaseException as exc:  # reported with the checkpoint
                err = exc
            finally:
                snapshot.stop()  # wake the loop if it still waits for staging
            report = self.driver.report(it, results, jobs, err)
            with self.lock:
                self.outbox.append((it, report))

        threading.Thread(target=work, name=f"persist-{it}", daemon=True).start()

    def _peer_restart(self) -> None:
        """The node restart from the replicas of the last checkpoint (runner.async_peer);
        its records and the replications' reach process 0 whether it succeeds or not."""
        assert self.peers is not None
        last = self.o.iterations
        failed: RunFailed | None = None
        try:
            self.peers.restart(last, self.driver.jobs(last), self.state.offsets, self.expected)
        except RunFailed as exc:  # every process alike
            failed = exc
        gathered = self.comm.gather(self.peers.records)
        if gathered is not None and self.sink is not None:
            self.sink.write_all([r for recs in gathered for r in recs])
        if failed is not None:
            raise failed

    # --- the collective that carries persists to process 0 and commits back ---
    def _sync(self) -> None:
        with self.lock:
            mine, self.outbox = self.outbox, []
        gathered = self.comm.gather(mine)
        news: dict[int, Decision] = {}
        if self.root:
            assert gathered is not None
            news = self._coordinate(gathered)
        news = self.comm.bcast(news)
        for it, decision in sorted(news.items()):
            self.final[it] = decision
            decision.check(f"checkpoint {it}: the background persist failed: ",
                           f" ({_left(it)})")

    def _coordinate(self, gathered: list[list[tuple[int, PhaseReport]]]
                    ) -> dict[int, Decision]:
        for proc, items in enumerate(gathered):
            for it, report in items:
                self.pending.setdefault(it, [None] * self.comm.size)[proc] = report
        for it in [i for i, reps in self.pending.items() if all(r is not None for r in reps)]:
            self.commits[it] = self._commit(it, self.pending.pop(it))
        news = {}
        for it in [i for i, c in self.commits.items() if c.decision is not None]:
            done = self.commits.pop(it)
            if self.sink is not None:
                self.sink.write_all(done.sink.records)
            assert done.decision is not None
            news[it] = done.decision
        return news

    def _commit(self, it: int, reports: list[Any]) -> _Commit:
        c = _Commit()

        def work() -> None:
            try:
                decision = self.driver.commit(it, reports, c.sink)
            except BaseException as exc:  # e.g. the target gone while removing the rest
                kind, message = describe_error(exc)
                decision = Decision.failed(kind, message)
            span = next((r.commit_ns for r in c.sink.records
                         if isinstance(r, SavePhaseRecord)), None)
            # a format that commits itself (torch-dcp) is durable when its ranks are done
            ends = [r.end_ns for r in c.sink.records if isinstance(r, RankRecord)]
            c.decision = decision.durable_at(
                span[1] if span else max(ends, default=None) if decision.ok else None)

        c.thread = threading.Thread(target=work, name=f"commit-{it}", daemon=True)
        c.thread.start()
        return c

    # --- records (process 0, after the loop) ---
    def _write_records(self, facts: LoopRecord, baseline: tuple[list[int], list[float]],
                       steps: tuple[list[int], list[float]]) -> None:
        gathered = self.comm.gather((facts, baseline, steps, self.timings))
        if not self.root or self.sink is None:
            return
        assert gathered is not None
        records: list[Record] = []
        for proc, (fact, base, loop, timings) in enumerate(gathered):
            records += [fact, StepsRecord("baseline", proc, *base), StepsRecord("async", proc, *loop)]
            for t in timings:
                final = self.final[t["iteration"]]
                d = final.durable_ns
                records.append(CheckpointRecord(
                    t["iteration"], proc, fact.ranks, final.ok, fact.bytes,
                    t["start_ns"], t["wait_s"], t["refresh_s"], t["limit_s"], t["snapshot_s"],
                    t["blocking_s"], t["resume_ns"],
                    (d - t["snapshot_ns"]) / 1e9 if d is not None else None,
                    (d - t["resume_ns"]) / 1e9 if d is not None else None, d))
        self.sink.write_all(records)
