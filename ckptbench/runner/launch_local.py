"""The embedded default: plan ranks as local processes forked from this one.

The parent prepares the target, writes the run record, forks one process per plan rank
and watches them: progress comes through a shared array, records (process 0's) and the
first error through queues, and a process that dies makes the parent stop the rest (no
hang). Every child asks the kernel to kill it when the parent dies (PR_SET_PDEATHSIG), so
no rank outlives a killed parent.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
from collections.abc import Iterable
from typing import Any

from ckptbench.errors import RunFailed, describe_error
from ckptbench.records import JsonlSink, Record, as_dict
from ckptbench.runner.comm import ProcessComm, SingleComm
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.options import RunRequest
from ckptbench.runner.session import Launcher, Progress, Topology
from ckptbench.runner.stall import OnStall, StallWatch

GRACE_S = 5.0  # after a process fails, how long the others get to report before being stopped
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
        errors.put(("stall", message))
        for q in (records, errors):
            q.close()
            q.join_thread()
        os._exit(COORDINATED_EXIT[0])
    return stalled


def _child(index: int, req: RunRequest, parent: int, barrier: Any, inboxes: list[Any],
           progress: Any, errors: Any, records: Any) -> None:
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
    # SIGTERM/SIGHUP (to the process group, by timeout/systemd/Slurm): end at once; the
    # parent, which handles them (runner.signals), removes what the run wrote.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    ranks = req.ranks
    comm = ProcessComm(index, len(ranks), barrier, inboxes)

    def tick(n: int) -> None:
        progress[index] += n

    watch = StallWatch(req.options.stall_timeout, _report_stall(errors, records),
                       f"rank {ranks[index]}")
    code = 0
    try:
        run_iterations(req.plan, [ranks[index]], ranks, req.backend, comm, req.options,
                       QueueSink(records) if index == 0 else None, tick, watch,
                       req.names)
    except RunFailed as exc:
        if index == 0:
            errors.put((exc.kind, str(exc)))
        code = exc.exit_code
    except BaseException as exc:
        errors.put(describe_error(exc))
        comm.abort()
        code = 1
    finally:
        for q in (records, errors):
            q.close()
            q.join_thread()  # the messages must reach the parent before _exit
    os._exit(code)


class LocalLauncher(Launcher):
    """Local processes, one per plan rank (`in_process`: a single rank runs in this one)."""

    kind = "local"

    def __init__(self, in_process: bool = False) -> None:
        self.in_process = in_process

    def topology(self, req: RunRequest) -> Topology:
        host, ranks = socket.gethostname(), req.ranks
        return Topology(req.options.run_id, [[r] for r in ranks], [host] * len(ranks),
                        {"method": "one host: all processes read the same CLOCK_MONOTONIC"})

    def run(self, req: RunRequest, topo: Topology, sink: JsonlSink | None,
            progress: Progress | None) -> None:
        if self.in_process and len(req.ranks) == 1:
            run_iterations(req.plan, req.ranks, req.ranks, req.backend, SingleComm(),
                           req.options, sink, progress, names=req.names)
            return
        _run_forked(req, sink, progress)


def _drain(records: Any, sink: JsonlSink | None) -> None:
    while True:
        try:
            batch = records.get_nowait()
        except queue.Empty:
            return
        if sink is not None:
            sink.write_all(batch)


def _reap(procs: list[Any]) -> None:
    """Wait for every rank; one that outlives a grace period after being asked to stop
    (or that is still running however this was left) is killed: none outlives the run."""
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def _run_forked(req: RunRequest, sink: JsonlSink | None, on_progress: Progress | None) -> None:
    ctx = mp.get_context("fork")
    ranks = req.ranks
    size = len(ranks)
    barrier = ctx.Barrier(size)
    inboxes = [ctx.Queue() for _ in range(size)]
    progress = ctx.Array("q", size, lock=False)
    errors, records = ctx.Queue(), ctx.Queue()
    if sink is not None:
        sink.flush()
    procs = [ctx.Process(target=_child, args=(i, req, os.getpid(), barrier, inboxes, progress,
                                               errors, records), daemon=True)
             for i in range(size)]
    for p in procs:
        p.start()
    try:
        first_dead = _watch(procs, barrier, progress, records, sink, on_progress)
    except BaseException:  # interrupted (runner.signals) or broken: stop every rank
        barrier.abort()
        for p in procs:
            p.terminate()
        raise
    finally:
        _reap(procs)
        _drain(records, sink)
    if first_dead is None and all(p.exitcode == 0 for p in procs):
        return
    raise _failure(ranks, procs, first_dead, errors)


def _watch(procs: list[Any], barrier: Any, progress: Any, records: Any, sink: JsonlSink | None,
           on_progress: Progress | None) -> tuple[int, int] | None:
    """Until every rank has ended: records to the sink, progress to the caller. The first
    rank to fail wakes the others (they may wait for it in a barrier or a gather), and
    those still running GRACE_S later are stopped. Returns (index, exit code) of that rank."""
    reported = 0
    first_dead: tuple[int, int] | None = None
    failed_at = 0.0
    while any(p.is_alive() for p in procs):
        time.sleep(0.05)
        _drain(records, sink)
        done = sum(progress)
        if on_progress and done != reported:
            on_progress(done - reported)
            reported = done
        if first_dead is None:
            dead = next(((i, p.exitcode) for i, p in enumerate(procs)
                         if p.exitcode not in (None, 0)), None)
            if dead is not None:
                first_dead, failed_at = dead, time.monotonic()
                barrier.abort()
        elif time.monotonic() - failed_at > GRACE_S:
            for p in procs:
                if p.is_alive():
                    p.terminate()
    return first_dead


def _failure(ranks: list[int], procs: list[Any], first_dead: tuple[int, int] | None,
             errors: Any) -> RunFailed:
    """What stopped the run: the error a rank reported, or how the first one died."""
    reports = []
    while True:
        try:
            reports.append(errors.get(timeout=0.5))
        except queue.Empty:
            break
    index, code = first_dead if first_dead else (0, procs[0].exitcode or 1)
    if code not in COORDINATED_EXIT or not reports:
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        return RunFailed(f"rank {ranks[index]} died ({how}); the run was stopped", "internal")
    kind, message = reports[0]
    return RunFailed(message, kind)
