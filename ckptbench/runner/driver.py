"""The iteration loop every process runs collectively, and the records it leaves.

Process 0 is the coordinator: it commits each checkpoint's manifest, sends the records to
the sink, decides together with the others whether an iteration failed, and cleans up.

save      the format writes (behind a barrier: the clock starts there) -> gather digests
          and timed ops to process 0 -> process 0 commits the manifest atomically
cache     each process evicts its files from caches; process 0 drops the host's page
          cache where the backend can (or O_DIRECT made it moot)
restore   the format reads the manifest, then every chunk, and checks every digest
cleanup   process 0 deletes the checkpoint unless --keep

--mode async runs its own loop (runner.async_mode), handed this module's commit and
restore so that a checkpoint is committed and restored the same way.

Errors inside a phase are caught on each process and gathered, so the group always
decides together: a failed iteration is removed (no manifest is ever left for it) and
the run stops with the finished iterations' records kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.backends import Backend
from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats import open_format
from ckptbench.formats.base import (
    MANIFEST_SCHEMA,
    FileJob,
    Format,
    ThreadResult,
    TimedOp,
    file_jobs,
    first_error,
    manifest_files,
    now,
)
from ckptbench.plan import Plan
from ckptbench.records import (
    ErrorRecord,
    OpRecord,
    RankRecord,
    Record,
    RecordSink,
    RestorePhaseRecord,
    SavePhaseRecord,
)
from ckptbench.runner.comm import Comm
from ckptbench.runner.options import RunOptions

OP_KINDS = ("open", "write", "fsync", "close", "read")


def _restore_ranks(my_ranks: list[int], all_ranks: list[int], shift: int) -> list[int]:
    pos = {r: k for k, r in enumerate(all_ranks)}
    return [all_ranks[(pos[r] + shift) % len(all_ranks)] for r in my_ranks]


@dataclass(frozen=True)
class RankOp:
    """A format's timed op, on process 0's clock, with the plan rank and thread it was for."""

    op: TimedOp
    rank: int
    thread: int


@dataclass
class PhaseReport:
    """What one process sends to the coordinator after a phase (picklable)."""

    ops: list[RankOp]
    digests: dict[int, list[int]]
    mismatches: list[str]
    error: tuple[str, str] | None
    host: str
    backend_stats: dict[str, int]
    manifest: tuple[int, int] | None = None  # reading the manifest (restore), clock-shifted


def _report(results: list[ThreadResult], jobs: list[FileJob], comm: Comm,
            error: BaseException | None, backend_stats: dict[str, int]) -> PhaseReport:
    job_rank = {j.index: j.rank for j in jobs}
    offset = comm.clock_offset_ns()
    ops = [RankOp(replace(o, start_ns=o.start_ns + offset, end_ns=o.end_ns + offset),
                  job_rank[o.file], t) for t, r in enumerate(results) for o in r.ops]
    return PhaseReport(ops, {f: d for r in results for f, d in r.digests.items()},
                       [m for r in results for m in r.mismatches],
                       describe_error(error) if error else None, comm.host(), backend_stats)


def _records(plan: Plan, iteration: int, phase: str,
             gathered: list[PhaseReport]) -> list[Record]:
    out: list[Record] = []
    per_rank: dict[int, RankRecord] = {}
    for proc, report in enumerate(gathered):
        for rop in report.ops:
            o = rop.op
            a, b = o.start_ns, o.end_ns
            out.append(OpRecord(iteration, phase, rop.rank, rop.thread, o.op,
                                plan.file_paths[o.file], o.nbytes, a, b, extra=o.extra))
            rec = per_rank.get(rop.rank)
            if rec is None:
                rec = per_rank[rop.rank] = RankRecord(
                    iteration, phase, rop.rank, proc, report.host, start_ns=a, end_ns=b,
                    seconds=dict.fromkeys(OP_KINDS, 0.0))
            rec.bytes += o.nbytes
            rec.ops += 1
            rec.start_ns = min(rec.start_ns, a)
            rec.end_ns = max(rec.end_ns, b)
            rec.seconds[o.op] = rec.seconds.get(o.op, 0.0) + (b - a) / 1e9
            if o.extra and "stored_bytes" in o.extra:
                rec.stored_bytes = (rec.stored_bytes or 0) + o.extra["stored_bytes"]
    for report in gathered:  # backend counters (retries...) go to the process's first rank
        ranks_of_proc = sorted({rop.rank for rop in report.ops})
        if ranks_of_proc and report.backend_stats:
            per_rank[ranks_of_proc[0]].backend = report.backend_stats
    out += [per_rank[r] for r in sorted(per_rank)]
    return out


def run_iterations(plan: Plan, my_ranks: list[int], all_ranks: list[int], backend: Backend,
                   comm: Comm, options: RunOptions, sink: RecordSink | None,
                   progress: Callable[[int], None] | None = None) -> None:
    """Run every iteration; raise RunFailed (on every process) when one fails."""
    if options.mode == "async":  # checkpoints of a training loop (runner.async_mode)
        from ckptbench.runner.async_mode import AsyncLoop, DriverPhases

        def restore(fmt: Format, it: int) -> None:
            restore_iteration(plan, fmt, my_ranks, all_ranks, backend, comm, options, sink, it)

        AsyncLoop(plan, my_ranks, backend, comm, options, sink, progress,
                  DriverPhases(_report, _commit, restore)).run()
        return
    fmt = open_format(options.format, plan, my_ranks, backend, comm, options.format_options(),
                      progress)
    coordinator = comm.rank == 0
    for it in range(1, options.iterations + 1):
        ckpt = f"{options.run_id}/{plan.checkpoint_name(it)}"
        manifest_key = f"{ckpt}/{plan.manifest}"
        jobs = file_jobs(plan, my_ranks, ckpt, it, options.seed)

        # --- save ---
        try:
            results = fmt.save(jobs)
            err = first_error(results)
        except BaseException as exc:  # noqa: BLE001 - decided together below
            results, err = [], exc
        gathered = comm.gather(_report(results, jobs, comm, err, backend.stats()))
        decision: dict[str, Any] = {"ok": True}
        if coordinator:
            assert gathered is not None
            decision = _commit(plan, backend, ckpt, manifest_key, it, options, gathered, sink)
        decision = comm.bcast(decision)
        if not decision["ok"]:
            raise RunFailed(decision["message"], decision["kind"])

        restore_iteration(plan, fmt, my_ranks, all_ranks, backend, comm, options, sink, it)

        # --- cleanup ---
        comm.barrier()
        if coordinator and not options.keep:
            backend.remove_tree(ckpt)


def restore_iteration(plan: Plan, fmt: Format, my_ranks: list[int], all_ranks: list[int],
                      backend: Backend, comm: Comm, options: RunOptions,
                      sink: RecordSink | None, it: int) -> None:
    """Collective, after iteration `it`'s checkpoint is committed: evict it from caches,
    then restore and verify it; raise RunFailed on every process when that fails."""
    ckpt = f"{options.run_id}/{plan.checkpoint_name(it)}"
    manifest_key = f"{ckpt}/{plan.manifest}"
    jobs = file_jobs(plan, my_ranks, ckpt, it, options.seed)
    coordinator = comm.rank == 0
    decision: dict[str, Any] = {"ok": True}
    # --- cache ---
    method = "none"
    if options.restore and options.cache == "auto":
        method = backend.drop_cache(fmt.cache_keys(jobs))
    comm.barrier()
    dropped = False
    if coordinator and options.restore and options.cache == "auto" and method == "fadvise":
        dropped = backend.drop_host_caches()
    if comm.bcast(dropped):
        method = f"{method}+drop_caches"
    methods = comm.gather(method)

    # --- restore ---
    if options.restore:
        read_ranks = _restore_ranks(my_ranks, all_ranks, options.restore_shift)
        rjobs = file_jobs(plan, read_ranks, ckpt, it, options.seed)
        manifest_t: tuple[int, int] | None = None
        try:
            rresults, manifest_t = fmt.restore(rjobs, manifest_key)
            rerr = first_error(rresults)
        except BaseException as exc:  # noqa: BLE001
            rresults, rerr = [], exc
        mine = _report(rresults, rjobs, comm, rerr, backend.stats())
        if manifest_t is not None:
            off = comm.clock_offset_ns()
            mine.manifest = (manifest_t[0] + off, manifest_t[1] + off)
        rgathered = comm.gather(mine)
        if coordinator:
            assert rgathered is not None and methods is not None
            decision = _finish_restore(plan, it, rgathered, methods, options, sink)
            if not decision["ok"] and not options.keep:
                backend.remove_tree(ckpt)
        decision = comm.bcast(decision)
        if not decision["ok"]:
            raise RunFailed(decision["message"], decision["kind"])


def _fail(gathered: list[PhaseReport]) -> tuple[str, str] | None:
    return next((r.error for r in gathered if r.error), None)


def _commit(plan: Plan, backend: Backend, ckpt: str, manifest_key: str, it: int,
            options: RunOptions, gathered: list[PhaseReport],
            sink: RecordSink | None) -> dict[str, Any]:
    records = _records(plan, it, "save", gathered)
    failure = _fail(gathered)
    commit: tuple[int, int] | None = None
    if failure is None:
        digests: dict[int, list[int]] = {}
        for report in gathered:
            digests.update(report.digests)
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "run_id": options.run_id,
            "iteration": it,
            "workload": plan.workload.name,
            "payload": options.payload,
            "seed": options.seed,
            "format": options.format,
            "codec": options.codec,
            "files": manifest_files(plan, ckpt, digests),
        }
        try:
            t0 = now()
            backend.put_atomic(manifest_key, json.dumps(manifest).encode())
            commit = (t0, now())
        except BaseException as exc:  # noqa: BLE001
            failure = describe_error(exc)
    if commit:
        records.append(OpRecord(it, "save", 0, -1, "commit", manifest_key.rsplit("/", 1)[-1], 0,
                                commit[0], commit[1]))
    records.append(SavePhaseRecord(it, failure is None, ckpt, len(gathered),
                                   [commit[0], commit[1]] if commit else None))
    if failure is not None:
        backend.remove_tree(ckpt)
        records.append(ErrorRecord(it, "save", failure[0], failure[1], removed=ckpt))
    if sink:
        sink.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


def _finish_restore(plan: Plan, it: int, gathered: list[PhaseReport], methods: list[str],
                    options: RunOptions, sink: RecordSink | None) -> dict[str, Any]:
    records = _records(plan, it, "restore", gathered)
    for proc, report in enumerate(gathered):
        if report.manifest is not None:
            a, b = report.manifest
            records.append(OpRecord(it, "restore", -1, -1, "manifest", plan.manifest, 0, a, b,
                                    process=proc))
    mismatches = [m for r in gathered for m in r.mismatches]
    failure = _fail(gathered)
    if failure is None and mismatches:
        failure = ("verification", mismatches[0] + (f" (and {len(mismatches) - 1} more chunks)"
                                                    if len(mismatches) > 1 else ""))
    unique_methods = sorted(set(methods))
    records.append(RestorePhaseRecord(
        it, failure is None, unique_methods[0] if len(unique_methods) == 1 else unique_methods,
        failure is None, len(mismatches), options.restore_shift))
    if failure is not None:
        records.append(ErrorRecord(it, "restore", failure[0], failure[1]))
    if sink:
        sink.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


__all__ = ["RunFailed", "restore_iteration", "run_iterations"]
