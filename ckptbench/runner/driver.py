"""The iteration loop every process runs collectively, and the records it leaves.

Process 0 is the coordinator: it commits each checkpoint's manifest, sends the records to
the sink, decides together with the others whether an iteration failed, and cleans up.

claim     process 0 creates the checkpoint's directory, exclusively (one that exists is
          someone else's: the run stops, never writes into it)
save      the format writes (behind a barrier: the clock starts there) -> each process
          encodes its files' manifest entries -> gather them, the digests and timed ops
          to process 0 -> process 0 joins the entries and commits the manifest
          atomically (its padding made once, before the first save; runner.parts times
          each part)
fill-in   a --ranks subset restoring by the DCP plan: process 0 writes the chunks its
          restoring ranks read from files the subset did not write, off the clock
          (runner.fill_in; removed once the restore is done)
cache     each process evicts its files from caches; process 0 drops the host's page
          cache where the backend can (or O_DIRECT made it moot)
restore   the format reads the manifest, then every chunk, and checks every digest: with
          the DCP restore plan, each rank of the restore layout reads the manifest and
          then the saved chunks DCP's load planner gives it (ranged reads)
cleanup   process 0 deletes the checkpoint unless --keep: the names the run wrote, then its
          directories if that leaves them empty (runner.cleanup)

--mode async runs its own loop (runner.async_mode), handed this module's claim, commit and
restore (:class:`Iterations`): a checkpoint is claimed, committed, restored, removed alike.

The steps run per checkpoint in turn, or all saves and then all restores (MLPerf Storage
v2.0's order): runner.sequence.

Errors inside a phase are caught on each process and gathered, so the group always
decides together: a failed iteration is removed (no manifest is ever left for it) and
the run stops with the finished iterations' records kept.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptbench.backends import Backend
from ckptbench.backends.base import HostCacheControl, PageCacheControl
from ckptbench.errors import RunFailed, describe_error
from ckptbench.formats import open_format
from ckptbench.formats.base import (
    FileJob,
    Format,
    PlannedRestore,
    ThreadResult,
    file_jobs,
    first_error,
    now,
)
from ckptbench.formats.fill_ins import FillIns, fill_in_dir, fill_ins_of
from ckptbench.formats.manifest import (
    CommitTimes,
    Digested,
    Manifest,
    ManifestWriter,
    encode_members,
    manifest_bytes,
    manifest_files,
)
from ckptbench.formats.ranged import restore_jobs
from ckptbench.plan import Plan
from ckptbench.plan.restore import RestorePlan, restore_plan_of
from ckptbench.plan.restore_ranks import restore_positions, restoring_ranks
from ckptbench.records import (
    ErrorRecord,
    OpRecord,
    RecordSink,
    RestorePhaseRecord,
    SavePhaseRecord,
)
from ckptbench.runner import threads
from ckptbench.runner.cleanup import RunNames, record_dir, remove_checkpoint, run_names
from ckptbench.runner.comm import Comm
from ckptbench.runner.decision import Decision, agree
from ckptbench.runner.fill_in import fill_in_at, write_fill_ins
from ckptbench.runner.options import RunOptions
from ckptbench.runner.parts import (
    coordinator_ops,
    restore_parts,
    save_parts,
    self_committed_parts,
)
from ckptbench.runner.phase_report import (
    PhaseReport,
    check_present,
    fan_in,
    measured_facts,
    phase_records,
    phase_report,
)
from ckptbench.runner.sequence import steps
from ckptbench.runner.stall import StallWatch, WatchedGroup


def _restore_ranks(my_ranks: list[int], all_ranks: list[int], shift: int) -> list[int]:
    pos = {r: k for k, r in enumerate(all_ranks)}
    return [all_ranks[(pos[r] + shift) % len(all_ranks)] for r in my_ranks]


def run_iterations(plan: Plan, my_ranks: list[int], all_ranks: list[int], backend: Backend,
                   comm: Comm, options: RunOptions, sink: RecordSink | None,
                   progress: Callable[[int], None] | None = None,
                   watch: StallWatch | None = None, names: RunNames | None = None) -> None:
    """Run every iteration; raise RunFailed (on every process) when one fails. With a
    `watch`, this process's saves and restores are watched for stalls (runner.stall).
    `names`: what the run writes (process 0 deletes by them; default one plan rank each).
    The process runs the options' intra-op threads throughout (runner.threads), set before
    the format opens."""
    with threads.applied(options.intra_op_threads, options.format):
        _run_iterations(plan, my_ranks, all_ranks, backend, comm, options, sink, progress,
                        watch, names)


def _run_iterations(plan: Plan, my_ranks: list[int], all_ranks: list[int], backend: Backend,
                    comm: Comm, options: RunOptions, sink: RecordSink | None,
                    progress: Callable[[int], None] | None, watch: StallWatch | None,
                    names: RunNames | None) -> None:
    run = Iterations(plan, my_ranks, all_ranks, backend, comm, options, sink, progress, watch,
                     names)
    if options.tier_plan is not None and options.mode == "sync":  # tiers (runner.tiers)
        from ckptbench.runner.tiers import TierRun

        TierRun(run).run_all()
        return
    if options.mode == "async":  # checkpoints of a training loop (runner.async_mode)
        from ckptbench.runner.async_mode import AsyncLoop

        AsyncLoop(run).run()
        return
    restore_only = bool(options.checkpoint)  # a kept checkpoint, restored again
    for step in steps(options.sequence, options.iterations):  # runner.sequence
        it = step.iteration
        if step.save and not restore_only:
            run.claim(it)
            run.save(it)
        if step.read:
            run.restore(it)


class Iterations:
    """One process's run as its iterations share it: the format (watched for stalls), the
    names process 0 deletes by, the restore plan and this process's ranks in it; the
    collective steps of one checkpoint (claim, restore and cleanup) for either mode."""

    def __init__(self, plan: Plan, my_ranks: list[int], all_ranks: list[int],
                 backend: Backend, comm: Comm, options: RunOptions, sink: RecordSink | None,
                 progress: Callable[[int], None] | None, watch: StallWatch | None,
                 names: RunNames | None) -> None:
        self.plan, self.my_ranks, self.all_ranks = plan, my_ranks, all_ranks
        self.backend, self.comm, self.options, self.sink = backend, comm, options, sink
        self.moved = _moved(progress, watch)
        self.fmt, self.watched = _watched_format(plan, my_ranks, backend, comm, options,
                                                 self.moved, watch)
        self.recorded = names is not None  # the session's: in an intent, kept up to date
        if comm.rank == 0 and names is None:
            names = run_names(plan, options, [[r] for r in all_ranks])
        self.made = names if names is not None else RunNames(options.run_id, (), ())
        self.rplan = restore_plan_of(plan) if options.uses_restore_plan else None
        self.restore_ranks: list[int] = []
        # A subset run wrote only its ranks' files: the others its restoring ranks read
        # are written as fill-ins before each restore (runner.fill_in)
        self.fill = FillIns(plan, {})
        if self.rplan is not None:
            self.restore_ranks = restore_positions(my_ranks, all_ranks, plan.world_size,
                                                   self.rplan.world_size, options.restore_shift)
            self.fill = fill_ins_of(self.rplan, all_ranks)
        self.restore_only = bool(options.checkpoint)  # a kept checkpoint, restored again
        self.writer: ManifestWriter | None = None
        if comm.rank == 0 and not self.restore_only:  # the padding made off the clock
            self.writer = ManifestWriter(manifest_bytes(plan, options.format))
            self.writer.prepare()

    def checkpoint(self, it: int) -> str:
        return self.options.checkpoint or f"{self.options.run_id}/{self.plan.checkpoint_name(it)}"

    def saved_as(self, it: int) -> int:
        return self.options.checkpoint_iteration if self.restore_only else it

    def jobs(self, it: int) -> list[FileJob]:
        """This process's jobs of iteration `it`'s checkpoint."""
        return file_jobs(self.plan, self.my_ranks, self.checkpoint(it), self.saved_as(it),
                         self.options.seed)

    def claim(self, it: int) -> None:
        """Collective: process 0 creates the checkpoint's directory, exclusively (never
        one that exists); RunFailed everywhere when it cannot."""
        decision: Decision | None = None
        if self.comm.rank == 0:
            try:
                self.create(self.plan.checkpoint_name(it))
                decision = Decision()
            except Exception as exc:
                kind, message = describe_error(exc)
                if self.sink:
                    self.sink.write(ErrorRecord(it, "save", kind, message))
                decision = Decision.failed(kind, message)
        agree(self.comm, decision)

    def create(self, name: str) -> None:
        """Process 0: directory `name`, made exclusively, in the intent before any write."""
        ident = self.backend.create_dir(f"{self.options.run_id}/{name}")
        self.made = self.made.made(name, ident)
        if ident is not None and self.recorded:
            record_dir(self.backend, self.made)

    def commit(self, it: int, gathered: list[PhaseReport], sink: RecordSink | None
               ) -> Decision:
        """Process 0: the manifest of iteration `it` committed atomically (or the partial
        checkpoint removed), its records to `sink`; the decision."""
        assert self.writer is not None
        return _commit(self, self.plan.checkpoint_name(it), it, gathered, sink)

    def report(self, it: int, results: list[ThreadResult], jobs: list[FileJob],
               err: BaseException | None) -> PhaseReport:
        """This process's report of a save, with its files' manifest entries encoded
        here (in parallel on every process: the coordinator only joins them)."""
        report = phase_report(results, jobs, self.comm, err, self.backend.stats())
        if err is None:
            ckpt = f"{self.options.run_id}/{self.plan.checkpoint_name(it)}"
            report.entries = encode_members(manifest_files(self.plan, ckpt, report.digests))
        return report

    def save(self, it: int) -> None:
        """Collective: the save phase of iteration `it`: the format writes, process 0
        commits the manifest or removes the partial checkpoint; RunFailed on every process
        when any failed."""
        comm, jobs = self.comm, self.jobs(it)
        try:
            with self.watched.watching(f"the save of {self.plan.checkpoint_name(it)}"):
                results = self.fmt.save(jobs)
            err = first_error(results)
        except BaseException as exc:
            results, err = [], exc
        gathered = comm.gather(self.report(it, results, jobs, err))
        decision: Decision | None = None
        if comm.rank == 0:
            assert gathered is not None
            decision = self.commit(it, gathered, self.sink)
        agree(comm, decision)

    def evict(self, it: int) -> list[str] | None:
        """Collective: `it`'s files out of the caches before a read (process 0: the methods)."""
        return _evict(self.fmt, self.jobs(it), self.backend, self.comm, self.options)

    def restore(self, it: int) -> None:
        """Collective, once iteration `it`'s checkpoint is committed: evict it from caches,
        restore and verify it, then remove it unless kept; RunFailed everywhere when the
        restore fails."""
        plan, comm, options = self.plan, self.comm, self.options
        name, ckpt, saved_as = plan.checkpoint_name(it), self.checkpoint(it), self.saved_as(it)
        coordinator = comm.rank == 0
        fill_jobs, fill_digests = write_fill_ins(self, it) if options.restore else ([], {})
        methods = _evict(self.fmt, self.jobs(it) + fill_jobs, self.backend, comm, options)
        if options.restore:
            manifest_key = f"{ckpt}/{plan.manifest}"
            manifest_t: tuple[int, int] | None = None
            rjobs: list[FileJob] = []
            decision: Decision | None = None
            try:
                with self.watched.watching(f"the restore of {name}"):
                    if self.rplan is not None:
                        rjobs = restore_jobs(self.rplan, self.restore_ranks, ckpt, saved_as,
                                             options.seed, self.fill, fill_in_at(self, it))
                        filled = {j.name: Digested(digests=fill_digests[j.index]) for j in rjobs
                                  if j.index in fill_digests}
                        planned: PlannedRestore | None = PlannedRestore(self.restore_ranks,
                                                                        filled)
                    else:
                        read_ranks = _restore_ranks(self.my_ranks, self.all_ranks,
                                                    options.restore_shift)
                        rjobs = file_jobs(plan, read_ranks, ckpt, saved_as, options.seed)
                        planned = None
                    restored = self.fmt.restore(rjobs, manifest_key, planned)
                rresults, manifest_t = restored.results, restored.manifest
                rerr = first_error(rresults)
            except BaseException as exc:
                rresults, rerr = [], exc
            mine = phase_report(rresults, rjobs, comm, rerr, self.backend.stats())
            if manifest_t is not None:
                off = comm.clock_offset_ns()
                mine.manifest = (manifest_t[0] + off, manifest_t[1] + off)
            rgathered = comm.gather(mine)
            if coordinator:
                assert rgathered is not None and methods is not None
                if self.fill:  # never kept: --keep keeps what the save wrote
                    remove_checkpoint(self.backend, self.made, fill_in_dir(plan, it))
                decision = _finish_restore(
                    plan, it, rgathered, methods, options, self.sink,
                    _restore_facts(plan, self.rplan, self.all_ranks, self.fill))
                if not decision.ok and not (options.keep or self.restore_only):
                    remove_checkpoint(self.backend, self.made, name)
            agree(comm, decision)

        # --- cleanup ---
        comm.barrier()
        if coordinator and not (options.keep or self.restore_only):
            remove_checkpoint(self.backend, self.made, name)


def _evict(fmt: Format, jobs: list[FileJob], backend: Backend, comm: Comm,
           options: RunOptions) -> list[str] | None:
    """Collective: each process evicts what it wrote from caches before a restore, then
    process 0 drops the host's page cache where the backend can; process 0 gets each
    process's method (what the restore record says)."""
    evict = options.restore and options.cache == "auto"
    cache = backend if isinstance(backend, PageCacheControl) else None
    host = backend if isinstance(backend, HostCacheControl) else None
    method = cache.drop_cache(fmt.cache_keys(jobs)) if evict and cache else "none"
    comm.barrier()
    dropped = (comm.rank == 0 and evict and method == "fadvise" and host is not None
               and host.drop_host_caches())
    if comm.bcast(dropped):
        method = f"{method}+drop_caches"
    return comm.gather(method)


def _moved(progress: Callable[[int], None] | None, watch: StallWatch | None
           ) -> Callable[[int], None]:
    """What a format calls as bytes move: the stall watch's tick and the progress bar."""
    def moved(n: int) -> None:
        if watch is not None:
            watch.tick(n)
        if progress is not None:
            progress(n)
    return moved


def _watched_format(plan: Plan, my_ranks: list[int], backend: Backend, comm: Comm,
                    options: RunOptions, moved: Callable[[int], None],
                    watch: StallWatch | None) -> tuple[Format, StallWatch]:
    """The run's format, its bytes reported to `moved` (the stall watch and progress), its
    waits for peers holding the watch; and the watch to arm around its phases (one that
    never fires for a format that reports its bytes only once per phase)."""
    if watch is not None and watch.enabled:
        backend.watch_requests(watch)  # its control requests under the watch too
    watch = watch or StallWatch(0, lambda _message: None)
    fmt = open_format(options.format, plan, my_ranks, backend, WatchedGroup(comm, watch),
                      options.format_options(), moved)
    if fmt.streams_progress:
        return fmt, watch
    return fmt, StallWatch(0, watch.on_stall)


def _restore_facts(plan: Plan, rplan: RestorePlan | None, all_ranks: list[int],
                   fill: FillIns) -> dict[str, object]:
    """What the restore phase record says of the plan it ran: the restore layout, the
    ranks that ran, the bytes they were to read and the plan's amplification (bytes read
    over the checkpoint's; each file read back once: 1), and the fill-ins written for it
    (off the clock; none for a run of every rank)."""
    if rplan is None:
        planned = plan.bytes_of_ranks(all_ranks)
        return {"restore_plan": "files", "restore_world_size": plan.world_size,
                "restore_layout": plan.workload.parallel.label,
                "restore_ranks": len(all_ranks), "amplification": 1.0 if planned else 0.0,
                "planned_read_bytes": planned}
    ranks = restoring_ranks(all_ranks, plan.world_size, rplan.world_size)
    return {
        "restore_plan": rplan.source, "restore_world_size": rplan.world_size,
        "restore_layout": rplan.layout.label, "restore_ranks": len(ranks),
        "amplification": rplan.amplification, "planned_read_bytes": rplan.bytes_of_ranks(ranks),
        "fill_in_files": fill.names(), "fill_in_bytes": fill.total_bytes,
    }


def _fail(gathered: list[PhaseReport]) -> tuple[str, str] | None:
    return next((r.error for r in gathered if r.error), None)


def _commit(run: Iterations, name: str, it: int, gathered: list[PhaseReport],
            sink: RecordSink | None) -> Decision:
    """Process 0: the manifest of `name` built, encoded and committed (or the partial
    checkpoint removed); the save's records, its parts timed (runner.parts)."""
    plan, options, backend = run.plan, run.options, run.backend
    assert run.writer is not None
    ckpt = f"{options.run_id}/{name}"
    manifest_key = f"{ckpt}/{plan.manifest}"
    records = phase_records(plan, it, "save", gathered)
    failure = _fail(gathered)
    times: CommitTimes | None = None
    if failure is None:
        try:  # storage, before the coordinator's part (in the gather's)
            check_present(backend, ckpt, gathered, plan if options.format == "raw" else None)
        except BaseException as exc:
            failure = describe_error(exc)
    if failure is None:
        built = now()
        objects: dict[str, int] = {}
        for report in gathered:
            objects.update(report.objects or {})
        manifest = {
            "schema": Manifest.SCHEMA,
            "run_id": options.run_id,
            "iteration": it,
            "workload": plan.workload.name,
            "payload": options.payload,
            "seed": options.seed,
            "format": options.format,
            "codec": options.codec,
            "workload_spec": plan.workload.to_dict(),
            # the ranks that wrote: every file of each has an entry (restore checks it)
            "ranks": sorted({int(plan.file_rank[f]) for r in gathered for f in r.digests}),
        }
        if objects:  # metadata objects a reader needs (zarr.json, DCP's .metadata)
            manifest["objects"] = dict(sorted(objects.items()))
        pieces = [r.entries for r in gathered if r.entries is not None]
        if len(pieces) < len(gathered):  # reports without entries: built here
            digests = {f: d for r in gathered for f, d in r.digests.items()}
            manifest["files"] = manifest_files(plan, ckpt, digests)
        try:
            times = run.writer.commit(backend, manifest_key, manifest,
                                      pieces if len(pieces) == len(gathered) else None)
        except BaseException as exc:
            failure = describe_error(exc)
    parts: dict[str, float] | None = None
    off_clock: dict[str, float] | None = None
    if times and run.fmt.commits_itself:  # the library committed: ours is bookkeeping
        parts, off_clock = self_committed_parts(records, built, times)
    elif times:
        records += coordinator_ops(it, records, built, times, manifest_key.rsplit("/", 1)[-1])
        parts = save_parts(records, built, times)
    records.append(SavePhaseRecord(
        it, failure is None, ckpt, len(gathered),
        [times.encoded, times.end] if times and off_clock is None else None, parts, off_clock))
    if failure is not None:
        remove_checkpoint(backend, run.made, name, uploads=True)
        records.append(ErrorRecord(it, "save", failure[0], failure[1], removed=ckpt))
    if sink:
        sink.write_all(records)
    return Decision.failed(*failure) if failure is not None else Decision()


def _finish_restore(plan: Plan, it: int, gathered: list[PhaseReport], methods: list[str],
                    options: RunOptions, sink: RecordSink | None,
                    facts: dict[str, object] | None = None) -> Decision:
    records = phase_records(plan, it, "restore", gathered)
    for proc, report in enumerate(gathered):
        if report.manifest is not None:
            a, b = report.manifest
            records.append(OpRecord(it, "restore", -1, -1, "manifest", plan.manifest, 0, a, b,
                                    process=proc))
    mismatches = [m for r in gathered for m in r.mismatches]
    failure = _fail(gathered)
    measured = measured_facts(gathered)  # a format's own parts (torch-dcp's load) are kept
    parts = (restore_parts(records) if failure is None and not mismatches
             and "parts" not in measured else {})
    if failure is None and mismatches:
        failure = ("verification", mismatches[0] + (f" (and {len(mismatches) - 1} more chunks)"
                                                    if len(mismatches) > 1 else ""))
    unique_methods = sorted(set(methods))
    records.append(RestorePhaseRecord(
        it, failure is None, unique_methods[0] if len(unique_methods) == 1 else unique_methods,
        failure is None and options.verify, len(mismatches), options.restore_shift,
        extra={**(facts or {}), **measured, **fan_in(gathered),
               **({"parts": parts} if parts else {})}))
    if failure is not None:
        records.append(ErrorRecord(it, "restore", failure[0], failure[1]))
    if sink:
        sink.write_all(records)
    return Decision.failed(*failure) if failure is not None else Decision()


__all__ = ["Iterations", "PhaseReport", "RunFailed", "run_iterations"]
