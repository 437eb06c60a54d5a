"""The embedded default: plan ranks as local processes forked from this one.

The parent prepares the target, writes the run record, forks one process per plan rank
and watches them: progress comes through a shared array, the first error through a
queue, and a process that dies makes the parent stop the rest (no hang).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from ckptbench.backends import Backend
from ckptbench.plan import Plan
from ckptbench.records import ResultsWriter
from ckptbench.runner.comm import ProcessComm, SingleComm
from ckptbench.runner.driver import RunFailed, run_iterations
from ckptbench.runner.engine import RunOptions, describe_error

GRACE_S = 5.0  # after a process fails, how long the others get to report before being stopped
COORDINATED_EXIT = (1, 2)  # exit codes of processes that reported their error


def _child(index: int, size: int, plan: Plan, ranks: list[int], backend: Backend,
           options: RunOptions, writer: ResultsWriter | None, barrier: Any, inboxes: list[Any],
           progress: Any, errors: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
    comm = ProcessComm(index, size, barrier, inboxes)

    def tick(n: int) -> None:
        progress[index] += n

    code = 0
    try:
        run_iterations(plan, [ranks[index]], ranks, backend, comm, options,
                       writer if index == 0 else None, tick)
    except RunFailed as exc:
        if index == 0:
            errors.put((exc.kind, str(exc)))
        code = exc.exit_code
    except BaseException as exc:  # noqa: BLE001 - reported, then the group is stopped
        errors.put(describe_error(exc))
        comm.abort()
        code = 1
    finally:
        if writer is not None:
            writer.flush()
        errors.close()
        errors.join_thread()  # the message must reach the parent before _exit
    os._exit(code)


def run_local(plan: Plan, ranks: list[int], backend: Backend, options: RunOptions,
              writer: ResultsWriter, on_progress: Callable[[int], None] | None = None) -> None:
    """Run the plan ranks `ranks` as local processes; raise RunFailed if the run fails."""
    if len(ranks) == 1 and os.environ.get("CKPTBENCH_INPROCESS") == "1":
        run_iterations(plan, ranks, ranks, backend, SingleComm(), options, writer, on_progress)
        return
    ctx = mp.get_context("fork")
    size = len(ranks)
    barrier = ctx.Barrier(size)
    inboxes = [ctx.Queue() for _ in range(size)]
    progress = ctx.Array("q", size, lock=False)
    errors = ctx.Queue()
    writer.flush()
    procs = [ctx.Process(target=_child, args=(i, size, plan, ranks, backend, options, writer,
                                               barrier, inboxes, progress, errors), daemon=True)
             for i in range(size)]
    for p in procs:
        p.start()
    reported = 0
    first_dead: tuple[int, int] | None = None  # (process index, exit code)
    failed_at = 0.0
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.05)
            done = sum(progress)
            if on_progress and done != reported:
                on_progress(done - reported)
                reported = done
            if first_dead is None:
                for i, p in enumerate(procs):
                    if p.exitcode not in (None, 0):
                        # Wake peers blocked in a barrier or a gather with this process.
                        first_dead, failed_at = (i, p.exitcode), time.monotonic()
                        barrier.abort()
                        break
            elif time.monotonic() - failed_at > GRACE_S:
                for p in procs:
                    if p.is_alive():
                        p.terminate()
    except KeyboardInterrupt:
        barrier.abort()
        for p in procs:
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join()
    if first_dead is None and all(p.exitcode == 0 for p in procs):
        return
    reports = []
    while True:
        try:
            reports.append(errors.get(timeout=0.5))
        except Exception:  # noqa: BLE001 - queue drained
            break
    index, code = first_dead if first_dead else (0, procs[0].exitcode or 1)
    if code not in COORDINATED_EXIT or not reports:
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        kind, message = "internal", f"rank {ranks[index]} died ({how}); the run was stopped"
    else:
        kind, message = reports[0]
    raise RunFailed(message, kind)
