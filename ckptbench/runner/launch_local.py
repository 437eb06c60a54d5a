"""The embedded default: plan ranks as local processes forked from this one.

The parent prepares the target, writes the run record, forks one process per plan rank
and watches them: progress comes through a shared array, records (process 0's) and the
first error through queues (read by a thread of the parent's, so a message half written
by a killed rank never blocks it), and a process that dies, or stalls while alive
(SIGSTOP included: runner.watch_ranks), makes the parent stop the rest (no hang); a
stalled rank's threads are dumped first (runner.thread_dump), into the error record. No
wait of the parent's is on a lock a rank could hold. Every child asks the kernel to kill it when the parent dies (PR_SET_PDEATHSIG), so
no rank outlives a killed parent. The parent's objects are frozen across the forks
(``gc.freeze``), so a rank's garbage collections never walk them: walking them would copy
the parent's heap into every rank page by page (copy-on-write) and cost a rank's timed
phase seconds that no trainer pays (a torch-dcp restore's ``metadata`` part: 2.4 s
instead of 0.5 s for 8 ranks on 2 cores).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterable
from typing import Any

from ckptbench.errors import RunFailed, describe_error
from ckptbench.records import ErrorRecord, JsonlSink, Record, as_dict
from ckptbench.runner.comm import ProcessComm, SingleComm
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.options import RunRequest
from ckptbench.runner.scheduler import node_name, placement, process_facts, step_facts
from ckptbench.runner.session import Launcher, Progress, RankProgress, Topology
from ckptbench.runner.stall import OnStall, Publish, StallWatch, with_threads
from ckptbench.runner.thread_dump import DumpFile
from ckptbench.runner.watch_ranks import Inbox, RankWatch

GRACE_S = 5.0  # after a process fails, how long the others get to report before being stopped
WHAT_BYTES = 128  # per rank: what its stall watch is armed for
COORDINATED_EXIT = (1, 2)  # exit codes of processes that reported their error
PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when its parent dies; then check the parent is still
    there (it may have died before the request)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's watch loop still stops us
        pass
    if os.getppid() != parent:
        os._exit(1)


class QueueSink:
    """Process 0's sink in a child: records go to the parent, which owns the real sink."""

    def __init__(self, q: Any) -> None:
        self._q = q

    def write(self, record: Record | dict[str, Any]) -> None:
        self._q.put([as_dict(record)])

    def write_all(self, records: Iterable[Record | dict[str, Any]]) -> None:
        self._q.put([as_dict(r) for r in records])

    def flush(self) -> None:
        return None


def _report_stall(errors: Any, records: Any) -> OnStall:
    """A stalled rank tells the parent why and exits (its I/O threads cannot be stopped):
    the parent stops the others and cleans up, as for any rank that failed."""
    def stalled(message: str) -> None:
        errors.put(("stall", message, False))
        for q in (records, errors):
            q.close()
            q.join_thread()
        os._exit(COORDINATED_EXIT[0])
    return stalled


class Shared:
    """What the parent and the ranks share without a lock (a rank killed while holding a
    lock would hold it for ever): each rank's bytes moved, what it is watched for (empty:
    no bytes expected now), the abort flag, and the file each rank dumps its threads into
    when it stalls."""

    def __init__(self, ctx: Any, size: int) -> None:
        self.dumps = [DumpFile() for _ in range(size)]
        self.progress = ctx.Array("q", size, lock=False)
        self.what = ctx.Array("c", size * WHAT_BYTES, lock=False)
        self.aborted = ctx.RawValue("b", 0)
        self.started = ctx.Array("q", size, lock=False)  # monotonic ns each rank began at
        self.forked_ns = 0  # the parent's, before the first fork

    def set_up_s(self) -> float | None:
        """From the first fork until the last rank ran (None: a rank never started)."""
        started = [int(t) for t in self.started]
        if not self.forked_ns or not all(started):
            return None
        return (max(started) - self.forked_ns) / 1e9

    def publisher(self, index: int) -> Publish:
        """A rank's StallWatch publishes here whether it expects bytes now."""
        def publish(what: str | None) -> None:
            data = (what or "").encode()[:WHAT_BYTES - 1]
            self.what[index * WHAT_BYTES:(index + 1) * WHAT_BYTES] = data.ljust(WHAT_BYTES, b"\0")
        return publish

    def watched_for(self, index: int) -> str:
        raw = self.what[index * WHAT_BYTES:(index + 1) * WHAT_BYTES]
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")


def _child(index: int, req: RunRequest, parent: int, shared: Shared, inboxes: list[Any],
           errors: Any, records: Any) -> None:
    shared.started[index] = time.monotonic_ns()
    shared.dumps[index].arm()  # before anything can stall: the parent may ask for the dump
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
    # SIGTERM/SIGHUP (to the process group, by timeout/systemd/Slurm): end at once; the
    # parent, which handles them (runner.signals), removes what the run wrote.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    ranks = req.ranks
    comm = ProcessComm(index, len(ranks), shared.aborted, inboxes)

    def tick(n: int) -> None:
        shared.progress[index] += n

    watch = StallWatch(req.options.stall_timeout, _report_stall(errors, records),
                       f"rank {ranks[index]}", shared.publisher(index),
                       shared.dumps[index].write)
    code = 0
    try:
        run_iterations(req.plan, [ranks[index]], ranks, req.backend, comm, req.options,
                       QueueSink(records) if index == 0 else None, tick, watch,
                       req.names)
    except RunFailed as exc:
        if index == 0:
            errors.put((exc.kind, str(exc), True))  # process 0 recorded it
        code = exc.exit_code
    except BaseException as exc:
        errors.put((*describe_error(exc), False))
        comm.abort()
        code = 1
    finally:
        comm.close(ok=code == 0)
        for q in (records, errors):
            q.close()
            q.join_thread()  # the messages must reach the parent before _exit
    os._exit(code)


class LocalLauncher(Launcher):
    """Local processes, one per plan rank (`in_process`: a single rank runs in this one)."""

    kind = "local"

    def __init__(self, in_process: bool = False) -> None:
        self.in_process = in_process
        self._set_up: tuple[float | None, str] = (None, "not measured")

    def topology(self, req: RunRequest) -> Topology:
        host, ranks = node_name(), req.ranks
        found = placement(step_facts(), [process_facts()], [list(ranks)])  # one task: this one
        return Topology(req.options.run_id, [[r] for r in ranks], [host] * len(ranks),
                        {"method": "one host: all processes read the same CLOCK_MONOTONIC"},
                        {"scheduler": found} if found else {})

    def run(self, req: RunRequest, topo: Topology, sink: JsonlSink | None,
            progress: Progress | None) -> None:
        if self.in_process and len(req.ranks) == 1:
            self._set_up = (0.0, "one rank in this process: nothing to set up")
            run_iterations(req.plan, req.ranks, req.ranks, req.backend, SingleComm(),
                           req.options, sink, progress, names=req.names)
            return
        shared = _run_forked(req, sink, progress)
        self._set_up = (shared.set_up_s(), f"{len(req.ranks)} local processes forked until "
                        "each one runs")

    def ranks_set_up(self) -> tuple[float | None, str]:
        return self._set_up


def _drain(inbox: Inbox, sink: JsonlSink | None) -> None:
    for batch in inbox.take_records():
        if sink is not None:
            sink.write_all(batch)


def _reap(procs: list[Any]) -> None:
    """Wait for every rank; one that outlives a grace period after being asked to stop
    (or that is still running however this was left) is killed: none outlives the run.
    Only waitpid and signals: nothing here waits on what a rank could hold."""
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()  # SIGKILL: a stopped (SIGSTOP) rank too
            p.join()


def _run_forked(req: RunRequest, sink: JsonlSink | None, on_progress: Progress | None) -> Shared:
    ctx = mp.get_context("fork")
    ranks = req.ranks
    size = len(ranks)
    shared = Shared(ctx, size)
    inboxes = [ctx.Queue() for _ in range(size)]
    errors, records = ctx.Queue(), ctx.Queue()
    if sink is not None:
        sink.flush()
    procs = [ctx.Process(target=_child, args=(i, req, os.getpid(), shared, inboxes,
                                               errors, records), daemon=True)
             for i in range(size)]
    shared.forked_ns = time.monotonic_ns()
    try:
        _run_ranks(procs, shared, Inbox(records, errors, start=False), sink, on_progress, req)
    finally:
        for dump in shared.dumps:
            dump.close()
    return shared


def _run_ranks(procs: list[Any], shared: Shared, inbox: Inbox, sink: JsonlSink | None,
               on_progress: Progress | None, req: RunRequest) -> None:
    """Start the ranks, watch them until they end, and raise RunFailed with the first
    failure (a stall's record holds the stalled rank's thread dump)."""
    ranks = req.ranks
    gc.freeze()  # the parent's objects: never walked by the ranks' collections
    try:
        for p in procs:
            p.start()
    finally:
        gc.unfreeze()
    inbox.start()  # its reading thread starts after the forks
    watch = RankWatch([p.pid or 0 for p in procs], ranks, req.options.stall_timeout)
    try:
        first_dead, stall = _watch(procs, shared, watch, inbox, sink, on_progress)
    except BaseException:  # interrupted (runner.signals) or broken: stop every rank
        shared.aborted.value = 1
        for p in procs:
            p.terminate()
        raise
    finally:
        _reap(procs)
        inbox.close()
        _drain(inbox, sink)
    if first_dead is None and stall is None and all(p.exitcode == 0 for p in procs):
        return
    kind, message, recorded = stall or _failure(ranks, procs, first_dead, inbox)
    threads = _stalled_threads(kind, shared, first_dead)
    if sink is not None and not recorded:  # a rank died or stalled: the record says why
        sink.write(ErrorRecord(0, "run", kind, message, threads=threads))
        sink.flush()
    raise RunFailed(message, kind)


def _stalled_threads(kind: str, shared: Shared,
                     first_dead: tuple[int, int] | None) -> str | None:
    """The thread dump of the rank that stalled, for the error record (None for other
    failures); stderr keeps its one line, which names where each thread waited."""
    if kind != "stall":
        return None
    for index, dump in enumerate(shared.dumps):
        threads = dump.read()
        if threads and (first_dead is None or first_dead[0] == index):
            return threads
    return None


Failure = tuple[str, str, bool]  # kind, message, whether process 0 already recorded it


def _watch(procs: list[Any], shared: Shared, watch: RankWatch, inbox: Inbox,
           sink: JsonlSink | None, on_progress: Progress | None
           ) -> tuple[tuple[int, int] | None, Failure | None]:
    """Until every rank has ended: records to the sink, progress to the caller, stalls
    watched from outside (runner.watch_ranks). The first rank to fail (or stall) wakes the
    others (they may wait for it in a gather), and those still running GRACE_S later are
    stopped. Returns (index, exit code) of the first rank that failed, or the stall."""
    reported = 0
    per_rank = on_progress.ranks if isinstance(on_progress, RankProgress) else None
    first_dead: tuple[int, int] | None = None
    stall: Failure | None = None
    failed_at = 0.0
    while any(p.is_alive() for p in procs):
        time.sleep(0.05)
        _drain(inbox, sink)
        done = sum(shared.progress)
        if on_progress and done != reported:
            on_progress(done - reported)
            reported = done
            if per_rank is not None:
                per_rank(shared.progress)
        if first_dead is None and stall is None:
            first_dead = next(((i, p.exitcode) for i, p in enumerate(procs)
                               if p.exitcode not in (None, 0)), None)
            stalled = None if first_dead else watch.check(shared.progress, shared.watched_for)
            if stalled is not None:
                index, message = stalled
                message = with_threads(message, shared.dumps[index].request(procs[index].pid))
                procs[index].kill()  # alive but moving nothing (stopped, or hung)
                stall = ("stall", message, False)
            if first_dead is not None or stall is not None:
                failed_at = time.monotonic()
                shared.aborted.value = 1
        elif time.monotonic() - failed_at > GRACE_S:
            for p in procs:
                if p.is_alive():
                    p.kill()  # SIGKILL: a stopped rank holds a SIGTERM pending for ever
    if on_progress and sum(shared.progress) != reported:  # the bytes of the last moments
        on_progress(sum(shared.progress) - reported)
    return first_dead, stall


def _failure(ranks: list[int], procs: list[Any], first_dead: tuple[int, int] | None,
             inbox: Inbox) -> Failure:
    """What stopped the run: the error a rank reported, or how the first one died:
    (kind, message, whether process 0 already recorded it)."""
    reports = inbox.errors()
    index, code = first_dead if first_dead else (0, procs[0].exitcode or 1)
    if code not in COORDINATED_EXIT or not reports:
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return ("internal", f"rank {ranks[index]} died ({how}); the run was stopped", False)
    kind, message, recorded = reports[0]
    return kind, message, recorded
