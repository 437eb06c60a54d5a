"""The iteration loop every process runs collectively, and the records it leaves.

Process 0 is the coordinator: it commits each checkpoint's manifest, sends the records to
the sink, decides together with the others whether an iteration failed, and cleans up.

claim     process 0 creates the checkpoint's directory, exclusively (one that exists is
          someone else's: the run stops, never writes into it)
save      the format writes (behind a barrier: the clock starts there) -> gather digests
          and timed ops to process 0 -> process 0 commits the manifest atomically
cache     each process evicts its files from caches; process 0 drops the host's page
          cache where the backend can (or O_DIRECT made it moot)
restore   the format reads the manifest, then every chunk, and checks every digest: with
          the DCP restore plan, each rank of the restore layout reads the manifest and
          then the saved chunks DCP's load planner gives it (ranged reads)
cleanup   process 0 deletes the checkpoint unless --keep: the names the run wrote, then its
          directories if that leaves them empty (runner.cleanup)

Errors inside a phase are caught on each process and gathered, so the group always
decides together: a failed iteration is removed (no manifest is ever left for it) and
the run stops with the finished iterations' records kept.
"""

from __future__ import annotations

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
from ckptbench.formats.manifest import encode_manifest
from ckptbench.formats.ranged import restore_jobs, restore_positions
from ckptbench.plan import Plan
from ckptbench.plan.metadata import dcp_metadata_bytes
from ckptbench.plan.restore import RestorePlan, restore_plan_of
from ckptbench.records import (
    ErrorRecord,
    OpRecord,
    RankRecord,
    Record,
    RecordSink,
    RestorePhaseRecord,
    SavePhaseRecord,
)
from ckptbench.runner.cleanup import RunNames, remove_checkpoint, run_names
from ckptbench.runner.comm import Comm
from ckptbench.runner.options import RunOptions
from ckptbench.runner.stall import StallWatch, WatchedGroup

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
    objects: dict[str, int] | None = None  # metadata objects written and their digests


def _report(results: list[ThreadResult], jobs: list[FileJob], comm: Comm,
            error: BaseException | None, backend_stats: dict[str, int]) -> PhaseReport:
    job_rank = {j.index: j.rank for j in jobs}
    offset = comm.clock_offset_ns()
    ops = [RankOp(replace(o, start_ns=o.start_ns + offset, end_ns=o.end_ns + offset),
                  o.rank if o.rank >= 0 else job_rank[o.file], t)
           for t, r in enumerate(results) for o in r.ops]
    return PhaseReport(ops, {f: d for r in results for f, d in r.digests.items()},
                       [m for r in results for m in r.mismatches],
                       describe_error(error) if error else None, comm.host(), backend_stats,
                       objects={k: d for r in results for k, d in r.objects.items()})


def _records(plan: Plan, iteration: int, phase: str,
             gathered: list[PhaseReport]) -> list[Record]:
    out: list[Record] = []
    per_rank: dict[int, RankRecord] = {}
    for proc, report in enumerate(gathered):
        for rop in report.ops:
            o = rop.op
            a, b = o.start_ns, o.end_ns
            name = plan.manifest if o.op == "manifest" else plan.file_paths[o.file]
            out.append(OpRecord(iteration, phase, rop.rank, rop.thread, o.op, name, o.nbytes,
                                a, b, extra=o.extra))
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
                   progress: Callable[[int], None] | None = None,
                   watch: StallWatch | None = None, names: RunNames | None = None) -> None:
    """Run every iteration; raise RunFailed (on every process) when one fails. With a
    `watch`, this process's saves and restores are watched for stalls (runner.stall).
    `names`: what the run writes (process 0 deletes by them; default: one plan rank a
    process)."""
    fmt, watched = _watched_format(plan, my_ranks, backend, comm, options, progress, watch)
    coordinator = comm.rank == 0
    if coordinator and names is None:
        names = run_names(plan, options, [[r] for r in all_ranks])
    made = names if names is not None else RunNames(options.run_id, (), ())  # process 0's
    rplan = restore_plan_of(plan) if options.uses_restore_plan else None
    restore_ranks: list[int] = []
    written: set[int] | None = None
    if rplan is not None:
        restore_ranks = restore_positions(my_ranks, all_ranks, plan.world_size,
                                          rplan.world_size, options.restore_shift)
        if len(all_ranks) < plan.world_size:  # a subset run wrote only its ranks' files
            written = {f for r in all_ranks for f in plan.files_of_rank(r)}
    restore_only = bool(options.checkpoint)  # a kept checkpoint, restored again
    for it in range(1, options.iterations + 1):
        name = plan.checkpoint_name(it)
        ckpt = options.checkpoint or f"{options.run_id}/{name}"
        saved_as = options.checkpoint_iteration if restore_only else it
        manifest_key = f"{ckpt}/{plan.manifest}"
        jobs = file_jobs(plan, my_ranks, ckpt, saved_as, options.seed)
        if not restore_only:
            # --- claim: a new directory (never one that exists) ---
            _agree(comm, _claim(backend, ckpt, it, sink) if coordinator else None)
            _save(plan, jobs, fmt, watched, backend, comm, made, name, it, options, sink)

        methods = _evict(fmt, jobs, backend, comm, options)

        # --- restore ---
        if options.restore:
            manifest_t: tuple[int, int] | None = None
            rjobs: list[FileJob] = []
            decision: dict[str, Any] = {"ok": True}
            try:
                with watched.watching(f"the restore of {plan.checkpoint_name(it)}"):
                    if rplan is not None:
                        rjobs, _, _ = restore_jobs(rplan, restore_ranks, ckpt, saved_as,
                                                   options.seed, written)
                        rresults = fmt.restore_ranged(rjobs, manifest_key, restore_ranks)  # type: ignore[attr-defined]
                    else:
                        read_ranks = _restore_ranks(my_ranks, all_ranks, options.restore_shift)
                        rjobs = file_jobs(plan, read_ranks, ckpt, saved_as, options.seed)
                        rresults, manifest_t = fmt.restore(rjobs, manifest_key)
                rerr = first_error(rresults)
            except BaseException as exc:
                rresults, rerr = [], exc
            mine = _report(rresults, rjobs, comm, rerr, backend.stats())
            if manifest_t is not None:
                off = comm.clock_offset_ns()
                mine.manifest = (manifest_t[0] + off, manifest_t[1] + off)
            rgathered = comm.gather(mine)
            if coordinator:
                assert rgathered is not None and methods is not None
                decision = _finish_restore(plan, it, rgathered, methods, options, sink,
                                           _restore_facts(plan, rplan, all_ranks, written))
                if not decision["ok"] and not (options.keep or restore_only):
                    remove_checkpoint(backend, made, name)
            _agree(comm, decision)

        # --- cleanup ---
        comm.barrier()
        if coordinator and not (options.keep or restore_only):
            remove_checkpoint(backend, made, name)


def _evict(fmt: Format, jobs: list[FileJob], backend: Backend, comm: Comm,
           options: RunOptions) -> list[str] | None:
    """Collective: each process evicts what it wrote from caches before a restore, then
    process 0 drops the host's page cache where the backend can; process 0 gets each
    process's method (what the restore record says)."""
    evict = options.restore and options.cache == "auto"
    method = backend.drop_cache(fmt.cache_keys(jobs)) if evict else "none"
    comm.barrier()
    dropped = comm.rank == 0 and evict and method == "fadvise" and backend.drop_host_caches()
    if comm.bcast(dropped):
        method = f"{method}+drop_caches"
    return comm.gather(method)


def _agree(comm: Comm, decision: dict[str, Any] | None) -> None:
    """Collective: process 0's decision on every process; RunFailed everywhere if not ok."""
    decision = comm.bcast(decision)
    if decision is not None and not decision["ok"]:
        raise RunFailed(decision["message"], decision["kind"])


def _claim(backend: Backend, ckpt: str, it: int, sink: RecordSink | None) -> dict[str, Any]:
    """Create the checkpoint's directory exclusively; on failure record why."""
    try:
        backend.create_dir(ckpt)
    except Exception as exc:
        kind, message = describe_error(exc)
        if sink:
            sink.write(ErrorRecord(it, "save", kind, message))
        return {"ok": False, "kind": kind, "message": message}
    return {"ok": True}


def _watched_format(plan: Plan, my_ranks: list[int], backend: Backend, comm: Comm,
                    options: RunOptions, progress: Callable[[int], None] | None,
                    watch: StallWatch | None) -> tuple[Format, StallWatch]:
    """The run's format, its bytes reported to `progress` and to the stall `watch`, its
    waits for peers holding the watch; and the watch to arm around its phases (one that
    never fires for a format that reports its bytes only once per phase)."""
    watch = watch or StallWatch(0, lambda _message: None)

    def moved(n: int) -> None:
        watch.tick(n)
        if progress is not None:
            progress(n)

    fmt = open_format(options.format, plan, my_ranks, backend, WatchedGroup(comm, watch),
                      options.format_options(), moved)
    if getattr(fmt, "streams_progress", True):
        return fmt, watch
    return fmt, StallWatch(0, watch.on_stall)


def _restore_facts(plan: Plan, rplan: RestorePlan | None, all_ranks: list[int],
                   written: set[int] | None) -> dict[str, Any]:
    """What the restore phase record says of the plan it ran."""
    if rplan is None:
        return {"restore_plan": "files"}
    ranks = (list(range(rplan.world_size)) if written is None
             else [r for r in all_ranks if r < rplan.world_size])
    out: dict[str, Any] = {
        "restore_plan": rplan.source, "restore_world_size": rplan.world_size,
        "restore_ranks": len(ranks), "amplification": rplan.amplification,
        "planned_read_bytes": rplan.bytes_of_ranks(ranks),
    }
    if written is not None:
        out["reads_outside_subset"] = sum(
            1 for r in ranks for i in rplan.reads_of_rank(r).tolist()
            if plan.chunk_nbytes[i] and int(plan.chunk_file[i]) not in written)
    return out


def _fan_in(gathered: list[PhaseReport]) -> dict[str, Any]:
    """Distinct ranks that read each file, as measured (reads of payload bytes)."""
    readers: dict[int, set[int]] = {}
    for report in gathered:
        for rop in report.ops:
            if rop.op.op == "read" and rop.op.nbytes:
                readers.setdefault(rop.op.file, set()).add(rop.rank)
    counts = sorted(len(v) for v in readers.values())
    if not counts:
        return {}
    return {"file_readers_max": counts[-1], "file_readers_median": counts[len(counts) // 2],
            "files_read": len(counts)}


def _save(plan: Plan, jobs: list[FileJob], fmt: Any, watched: StallWatch, backend: Backend,
          comm: Comm, names: RunNames, name: str, it: int, options: RunOptions,
          sink: RecordSink | None) -> None:
    """The save phase: the format writes, process 0 commits the manifest or removes the
    partial checkpoint; raises RunFailed on every process when any failed."""
    try:
        with watched.watching(f"the save of {plan.checkpoint_name(it)}"):
            results = fmt.save(jobs)
        err = first_error(results)
    except BaseException as exc:
        results, err = [], exc
    gathered = comm.gather(_report(results, jobs, comm, err, backend.stats()))
    decision: dict[str, Any] = {"ok": True}
    if comm.rank == 0:
        assert gathered is not None
        decision = _commit(plan, backend, names, name, it, options, gathered, sink)
    _agree(comm, decision)


def _fail(gathered: list[PhaseReport]) -> tuple[str, str] | None:
    return next((r.error for r in gathered if r.error), None)


def _commit(plan: Plan, backend: Backend, names: RunNames, name: str, it: int,
            options: RunOptions, gathered: list[PhaseReport],
            sink: RecordSink | None) -> dict[str, Any]:
    ckpt = f"{options.run_id}/{name}"
    manifest_key = f"{ckpt}/{plan.manifest}"
    records = _records(plan, it, "save", gathered)
    failure = _fail(gathered)
    commit: tuple[int, int] | None = None
    if failure is None:
        digests: dict[int, list[int]] = {}
        objects: dict[str, int] = {}
        for report in gathered:
            digests.update(report.digests)
            objects.update(report.objects or {})
        manifest = {
            "schema": MANIFEST_SCHEMA,
            "run_id": options.run_id,
            "iteration": it,
            "workload": plan.workload.name,
            "payload": options.payload,
            "seed": options.seed,
            "format": options.format,
            "codec": options.codec,
            "workload_spec": plan.workload.to_dict(),
            "files": manifest_files(plan, ckpt, digests),
        }
        if objects:  # metadata objects a reader needs (zarr.json, DCP's .metadata)
            manifest["objects"] = dict(sorted(objects.items()))
        # As big as DCP's .metadata for the whole plan, whatever part of it ran.
        pad = dcp_metadata_bytes(plan) if options.format == "raw" else 0
        data = encode_manifest(manifest, pad)
        try:
            t0 = now()
            backend.put_atomic(manifest_key, data)
            commit = (t0, now())
        except BaseException as exc:
            failure = describe_error(exc)
    if commit:
        records.append(OpRecord(it, "save", 0, -1, "commit", manifest_key.rsplit("/", 1)[-1], 0,
                                commit[0], commit[1]))
    records.append(SavePhaseRecord(it, failure is None, ckpt, len(gathered),
                                   [commit[0], commit[1]] if commit else None))
    if failure is not None:
        remove_checkpoint(backend, names, name, uploads=True)
        records.append(ErrorRecord(it, "save", failure[0], failure[1], removed=ckpt))
    if sink:
        sink.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


def _finish_restore(plan: Plan, it: int, gathered: list[PhaseReport], methods: list[str],
                    options: RunOptions, sink: RecordSink | None,
                    facts: dict[str, Any] | None = None) -> dict[str, Any]:
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
        failure is None, len(mismatches), options.restore_shift,
        extra={**(facts or {}), **_fan_in(gathered)}))
    if failure is not None:
        records.append(ErrorRecord(it, "restore", failure[0], failure[1]))
    if sink:
        sink.write_all(records)
    if failure is not None:
        return {"ok": False, "kind": failure[0], "message": failure[1]}
    return {"ok": True}


__all__ = ["RunFailed", "run_iterations"]
