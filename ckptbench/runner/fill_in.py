"""Writing the fill-ins (formats.fill_ins) of a subset run's restore, off the clock.

A run of some of the plan's ranks (``--ranks``, MLPerf's subset mode; ``ckptbench
restore`` of a checkpoint such a run kept) saves only those ranks' files, but with the
DCP restore plan its restoring ranks read saved chunks other ranks wrote. Before each
restore process 0 writes those chunks, as fill-ins with the payload rules of every file,
into a directory of the run's own beside its checkpoints (``checkpoint-N-fill-in``). The
restore then reads exactly the plan's bytes for its ranks and verifies every chunk, the
fill-ins' against the digests taken as they were written. Their names are in the run's
intent like every other file; they are removed once the restore that needed them is done
(``--keep`` keeps what the save wrote, not them); their writes are in no phase's
figures. The restore record names them and their bytes.

Their writes are watched for stalls as a save is (a store that stops answering ends the
run at --stall-timeout), without showing in the progress or the launcher's byte counts.
A write that fails is undone; what a store that stopped answering kept of them is named
in the error, with how to remove it (a leftover nobody is told of is debris for good).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ckptbench.backends.base import NOT_LISTED, own_leftover
from ckptbench.errors import describe_error
from ckptbench.formats.base import FileJob, first_error
from ckptbench.formats.fill_ins import fill_in_dir
from ckptbench.records import ErrorRecord
from ckptbench.redact import public_url
from ckptbench.runner.cleanup import SHOWN, remove_checkpoint
from ckptbench.runner.decision import Decision, agree

if TYPE_CHECKING:
    from ckptbench.runner.driver import Iterations


def fill_in_at(run: Iterations, it: int) -> str:
    """Where iteration `it`'s restore finds its fill-ins: beside the run's checkpoints."""
    return f"{run.options.run_id}/{fill_in_dir(run.plan, it)}"


def write_fill_ins(run: Iterations, it: int) -> tuple[list[FileJob], Mapping[int, list[int]]]:
    """Collective: process 0 writes the fill-ins of iteration `it`'s restore (none for a
    run of every rank). Returns process 0's jobs (evicted from caches with the rest) and,
    on every process, each fill-in's chunk digests; RunFailed everywhere when a write
    fails (its fill-ins removed, an error record written)."""
    if not run.fill:
        return [], {}
    comm, root = run.comm, run.comm.rank == 0
    where = fill_in_at(run, it)
    jobs = run.fill.jobs(where, run.saved_as(it), run.options.seed) if root else []
    fmt = run.fmt
    # no bytes of a measured phase (no progress), but the stall watch's ticks: armed
    # without telling the launcher, which counts only the phases' bytes
    progress, fmt.progress = fmt.progress, run.watched.tick
    try:
        with (run.watched.request(f"the writing of the fill-ins in {where}") if root
              else contextlib.nullcontext()):
            if root:
                run.create(fill_in_dir(run.plan, it))  # recorded: its cleanup deletes only there
            results = fmt.save(jobs)
        err = first_error(results)
    except BaseException as exc:
        results, err = [], exc
    finally:
        fmt.progress = progress
    errors = comm.gather(describe_error(err) if err is not None else None)
    decision: Decision | None = None
    if root:
        assert errors is not None
        failure = next((e for e in errors if e is not None), None)
        decision = Decision(digests={f: d for r in results for f, d in r.digests.items()})
        if failure is not None:
            remove_checkpoint(run.backend, run.made, fill_in_dir(run.plan, it))
            message = f"writing the fill-ins in {where}: {failure[1]}{left_note(run, where, jobs)}"
            if run.sink:
                run.sink.write(ErrorRecord(it, "restore", failure[0], message))
            decision = Decision.failed(failure[0], message)
    return jobs, agree(comm, decision).digests


def left_note(run: Iterations, where: str, jobs: list[FileJob]) -> str:
    """After the fill-ins in `where` were removed (best effort): '' if none is left, else
    which ones may be (those listed there; every one written, if the store cannot even
    list) and how they go: the run's own cleanup tries again at its end, and the run's
    intent names them for `ckptbench clean` (or a later run's --clean-debris)."""
    left = run.backend.left_behind(where, SHOWN)
    if not left:
        return ""
    unlisted = any(NOT_LISTED in x for x in left)
    names = sorted(j.key for j in jobs) if unlisted else [x for x in left if not own_leftover(x)]
    if not names:
        return ""
    shown = ", ".join(n.rsplit("/", 1)[-1] for n in names[:SHOWN])
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    target = run.backend.target.rstrip("/")
    endpoint = run.backend.endpoint_url
    flag = f" --endpoint-url {public_url(endpoint)}" if endpoint else ""
    return (f"; fill-ins {'maybe ' if unlisted else ''}left in {target}/{where} (the store did "
            f"not answer their removal): {shown}{more}; the run's cleanup tries again at its "
            f"end, and what it cannot remove its intent names: `ckptbench clean {target}"
            f"{flag} --yes` removes them once the store answers")


__all__ = ["fill_in_at", "left_note", "write_fill_ins"]
