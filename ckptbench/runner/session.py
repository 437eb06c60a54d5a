"""One run's lifecycle, whatever launches its processes.

results sink -> topology (which process runs which plan ranks, on which host, on whose
clock) -> the target prepared (process 0 first; under MPI every process checks it sees the
same target) -> debris of interrupted runs reported (or removed) -> the run's directory
claimed and its intent recorded (runner.cleanup) -> striping -> the run record -> the
iterations (runner.driver) on every process -> the end clock -> cleanup of what the run
wrote, by name -> release.

A :class:`Launcher` supplies what differs between local processes and MPI ranks: the
topology, how the processes agree on an error, and how the iteration loop is started on
each of them. The caller owns the sink: it summarizes what the sink kept in memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ckptbench.backends import Backend
from ckptbench.backends.base import Striping, own_leftover
from ckptbench.errors import CkptbenchError, RunFailed, describe_error
from ckptbench.formats import format_class
from ckptbench.plan import Plan
from ckptbench.plan.export import restore_summary
from ckptbench.plan.export import summary as plan_summary
from ckptbench.plan.restore import restore_plan_of
from ckptbench.records import SCHEMA, ClockRecord, ErrorRecord, JsonlSink, environment
from ckptbench.runner import threads
from ckptbench.runner.cleanup import (
    PROBE,
    RUN_DIR,
    SHOWN,
    UPLOADS_LEFT,
    Debris,
    Lease,
    RunNames,
    claim,
    handle_debris,
    keep_run,
    read_intent,
    recorded_ids,
    remove_run,
    run_names,
    write_intent,
)
from ckptbench.runner.options import RunRequest
from ckptbench.runner.resources import check_options, resource_error
from ckptbench.runner.signals import signal_name
from ckptbench.runner.startup import startup_record
from ckptbench.runner.tier_store import place_tiers, remove_run_copies

Progress = Callable[[int], None]


@runtime_checkable
class RankProgress(Protocol):
    """A progress that also shows each rank's bytes (ckptbench.progress.Status): a
    launcher that sees them (local processes) hands them on."""

    def __call__(self, n: int) -> None: ...

    def ranks(self, moved: Sequence[int]) -> None: ...


@dataclass
class Topology:
    """Where the run's processes are: plan ranks per process, nodes and their clocks."""

    run_id: str
    groups: list[list[int]]  # plan ranks of each process (local: one each)
    hosts: list[str]  # host of each process
    clock: dict[str, Any]  # how the processes share one time base (for the run record)
    extra: dict[str, Any] = field(default_factory=dict)  # launcher facts for the run record

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))

    def position_hosts(self) -> list[str]:
        """Host of each plan rank, in run order."""
        return [self.hosts[p] for p, g in enumerate(self.groups) for _ in g]


class Launcher(ABC):
    """How the processes of a run are started and talk: local processes or MPI ranks."""

    kind: str = "?"
    root: bool = True  # this process prepares the target, writes records and prints
    prepares_everywhere: bool = False  # every process has its own backend to prepare

    @abstractmethod
    def topology(self, req: RunRequest) -> Topology:
        """Collective: the run's processes and hosts (the run id agreed on)."""

    def agree(self, error: BaseException | None, where: str) -> None:
        """Collective: raise on every process if any process had an error."""
        if error is not None:
            raise error

    @abstractmethod
    def run(self, req: RunRequest, topo: Topology, sink: JsonlSink | None,
            progress: Progress | None) -> None:
        """Run the iterations on every process; raise RunFailed when one failed.
        `progress` gets the bytes moved (process 0's view); one with a `ranks` method also
        gets each rank's bytes where the launcher sees them (local processes)."""

    def end_clock(self, topo: Topology) -> ClockRecord | None:
        """Collective: the clock offsets measured again after the run (the drift)."""
        return None

    def barrier(self) -> None:
        return None

    def share(self, value: Any) -> Any:
        """Collective: process 0's `value` on every process (the run id it claimed)."""
        return value

    def per_node(self, k: int) -> tuple[Launcher | None, int]:
        """Collective: a launcher over the first `k` processes of each node (None on the
        processes left out) and the number of nodes: a sweep's point. Local processes are
        started one per rank, so any `k` runs on this one node."""
        return self, 1

    def idle_barrier(self) -> None:
        """Collective: a barrier that sleeps while it waits (processes left out of a
        point take no CPU from the processes measuring it)."""
        return None

    def ranks_set_up(self) -> tuple[float | None, str]:
        """After run(): how long the run's ranks took to be set up, and how (a part of a
        restart's start: runner.startup)."""
        return None, "not measured"


def check_supported(plan: Plan, backend: Backend, restore: bool = False,
                    processes: int = 1, format_name: str = "raw") -> None:
    """Refuse, in one line, a run the backend cannot serve (before anything is created)."""
    backend.check_run(shared_file=plan.workload.checkpoint.files == "shared",
                      restore=restore, processes=processes,
                      own_storage=format_class(format_name).own_storage)


def striping_record(backend: Backend, plan: Plan, run_id: str) -> dict[str, Any]:
    """Apply the workload's striping hints to the run's directory where the backend can;
    say what was applied or why not."""
    ck = plan.workload.checkpoint
    base = {"stripe_size": ck.stripe_size, "stripe_count": ck.stripe_count, "applied": False}
    if ck.stripe_count == 0:
        return {**base, "reason": "not requested ([checkpoint] stripe_count = 0)"}
    if not isinstance(backend, Striping):
        return {**base, "reason": f"not available for the {backend.name} backend"}
    return {**base, **backend.set_striping(run_id, ck.stripe_size, ck.stripe_count)}


def auto_restore_shift(hosts: list[str]) -> tuple[int, int]:
    """(shift, reads on the writer's own node) for plan-rank positions placed on `hosts`.

    The shift is the plan ranks per node when that sends every read to another node (the
    usual block placement); else the first shift that does; else the one with the fewest
    own-node reads. One node: (0, all).
    """
    n = len(hosts)
    ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
    h = np.array([ids[x] for x in hosts])
    if len(ids) <= 1:
        return 0, n
    per_node = int(np.bincount(h).max())
    best = (n + 1, 0)
    for s in [per_node, *range(1, n)]:
        own = int(np.count_nonzero(h == np.roll(h, -s)))
        if own == 0:
            return s, 0
        best = min(best, (own, s))
    return best[1], best[0]


def restore_shift(req: RunRequest, topo: Topology, launcher: str) -> dict[str, Any]:
    """The restore shift to use and where it came from (for the run record)."""
    hosts = topo.position_hosts()
    if req.restore_shift_auto:
        shift, own = auto_restore_shift(hosts)
        if launcher == "local":
            source = "auto: local processes (one node)"
        else:
            source = "auto: one node" if topo.nodes == 1 else "auto: plan ranks per node"
    else:
        shift = req.options.restore_shift
        arr = np.array(hosts)
        own = int(np.count_nonzero(arr == np.roll(arr, -(shift % len(hosts)))))
        source = "option"
    out: dict[str, Any] = {"value": shift, "source": source}
    if launcher != "local":
        out["own_node_reads"] = own
    return out


def run_record(req: RunRequest, launcher: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "run",
        "schema": SCHEMA,
        "run_id": req.options.run_id,
        "launcher": launcher,
        "workload": req.workload.to_dict(),
        "scale": req.scale,
        "run_workload": req.plan.workload.to_dict(),
        "plan": plan_summary(req.plan),
        "restore": (restore_summary(restore_plan_of(req.plan)) if req.options.uses_restore_plan
                    else {"source": "files"}),
        "ranks": req.ranks,
        "bytes_per_iteration": req.plan.bytes_of_ranks(req.ranks),
        "options": req.options.to_dict(),
        "command": req.command,
        "run_options": req.settings,
        "environment": environment(req.backend.describe()),
        **extra,
    }


Notice = Callable[[str], None]


@dataclass(frozen=True)
class _Prepared:
    names: RunNames  # the run id as claimed
    striping: dict[str, Any]
    debris: Debris | None


def _prepare(req: RunRequest, launcher: Launcher, topo: Topology, sink: JsonlSink | None,
             names: RunNames | None) -> _Prepared:
    """Collective: the results file and the target, process 0 first: the target checked and
    marked, debris of earlier runs looked for (and removed with --clean-debris), the run's
    directory claimed and its intent written before anything else, the striping record.
    On failure everything done here is undone on the way out."""
    backend = req.backend
    multi_node = topo.nodes > 1
    opened = False
    claimed: RunNames | None = None
    striping: dict[str, Any] = {}
    debris: Debris | None = None
    run_id = req.options.run_id
    probe = f"{run_id}/{PROBE}"
    try:
        error: BaseException | None = None
        if launcher.root:
            assert names is not None
            try:
                if sink is not None:
                    sink.open()
                    opened = True
                backend.prepare()
                debris = handle_debris(backend, req.options.clean_debris)
                run_id, ident = claim(backend, run_id)
                claimed = names = replace(names, run_id=run_id).made(RUN_DIR, ident)
                write_intent(backend, names)
                probe = f"{run_id}/{PROBE}"
                striping = striping_record(backend, req.plan, run_id)
                if multi_node:
                    backend.put_atomic(probe, topo.hosts[0].encode())
            except BaseException as exc:
                error = exc
        launcher.agree(error, "preparing the target")
        run_id = launcher.share(run_id)
        probe = f"{run_id}/{PROBE}"
        if launcher.prepares_everywhere and not launcher.root:
            try:
                backend.prepare()
                if multi_node and not backend.exists(probe):
                    raise CkptbenchError(
                        f"target {backend.target} is not shared with {topo.hosts[0]} (rank 0 "
                        "wrote a file there that this node does not see); allowed: a file "
                        "system or object store every node reaches")
            except BaseException as exc:
                error = exc
        launcher.agree(error, "checking the target")
    except BaseException:
        if sink is not None:
            sink.close()
            if opened:
                sink.path.unlink(missing_ok=True)  # nothing ran: no results file
        if claimed is not None:
            remove_run(backend, claimed)
        backend.release()
        raise
    if launcher.root and multi_node and claimed is not None:
        backend.remove_recorded(claimed.chain(), [PROBE], ())
    final = names if names is not None else RunNames(run_id, (), ())
    return _Prepared(replace(final, run_id=run_id), striping, debris)


def _finish(req: RunRequest, names: RunNames, clean: bool, sink: JsonlSink | None,
            notice: Notice) -> None:
    """Process 0, last: --keep keeps the finished checkpoints; otherwise everything the run
    wrote is removed by name (unfinished uploads too unless it ended cleanly) and what is left
    there, someone else's, is reported. Never raises over the run's own outcome."""
    backend = req.backend
    where = f"{backend.target.rstrip('/')}/{names.run_id}"
    try:
        names = _created(backend, names)
        if req.options.keep:
            left = keep_run(backend, names, clean)
        else:  # a clean end: each iteration removed its checkpoint (the driver), by name
            left = remove_run(backend, names, uploads=not clean, checkpoints=not clean)
    except (CkptbenchError, OSError) as exc:
        notice(f"cleaning up {where} failed: {describe_error(exc)[1]}; a later run reports "
               "what is left and removes it with --clean-debris")
        return
    if sink is not None:
        sink.write({"type": "cleanup", "run_id": names.run_id, "left": left})
        sink.flush()
    uploads = [x for x in left if UPLOADS_LEFT in x]
    left = [x for x in left if UPLOADS_LEFT not in x and not own_leftover(x)]  # in the record
    if left:
        more = "" if len(left) < SHOWN else " and more"
        notice(f"left in place in {where}: {', '.join(left)}{more} (not written by this run; "
               "ckptbench deletes only what it wrote)")
    if uploads:
        notice(f"{where}: {uploads[0]}; a later run with --clean-debris aborts them")


def _created(backend: Backend, names: RunNames) -> RunNames:
    """`names` with the checkpoint directories the run's process 0 created and recorded in
    the intent (the run directory's identity is this process's own, never re-read)."""
    if RUN_DIR not in names.ids:  # a store without directories: nothing recorded
        return names
    intent = read_intent(backend, names.run_id)
    recorded = recorded_ids(intent) if intent is not None else {}
    return replace(names, ids={**recorded, RUN_DIR: names.ids[RUN_DIR]})


def run_session(req: RunRequest, launcher: Launcher, sink: JsonlSink | None,
                on_progress: Progress | None = None,
                on_start: Callable[[], None] | None = None,
                on_notice: Notice | None = None) -> RunFailed | None:
    """Run `req` on `launcher`'s processes, records to `sink` (process 0's; None elsewhere).

    Returns the failure that stopped the run (its records are in the sink), or None. The
    sink stays open for the caller to append the summary; `on_start` is called on process
    0 once the target and the results file are known to be usable; `on_notice` gets the
    one-line notes for the user (debris found or removed, files left in place).
    """
    check_options(req)
    notice: Notice = on_notice or (lambda line: None)
    topo = launcher.topology(req)
    check_supported(req.plan, req.backend, req.options.restore, len(topo.groups),
                    req.options.format)
    launcher.agree(resource_error(req, topo), "checking the memory the run needs")
    if req.options.tiers.enabled:
        tiered, refused = place_tiers(req.options, req.plan, topo.groups, topo.hosts)
        launcher.agree(refused, "placing the recovery tiers")
        req = replace(req, options=tiered)
    shift = restore_shift(req, topo, launcher.kind)
    if req.options.uses_restore_plan:
        format_class(req.options.format).check_restore(req.plan, topo.groups, shift["value"])
    intra_op = threads.resolve(req.options.intra_op_threads, topo.hosts)
    req = replace(req, options=replace(req.options, run_id=topo.run_id,
                                       restore_shift=shift["value"],
                                       intra_op_threads=intra_op.value))
    names = run_names(req.plan, req.options, topo.groups) if launcher.root else None
    prepared = _prepare(req, launcher, topo, sink, names)
    names = prepared.names
    req = replace(req, options=replace(req.options, run_id=names.run_id),
                  names=names if launcher.root else None)
    if prepared.debris is not None:
        notice(prepared.debris.line(req.backend.target))
    if launcher.root and on_start:
        on_start()
    failure: RunFailed | None = None
    clean = False
    lease = Lease(req.backend, names.run_id) if launcher.root else None
    try:
        if sink is not None:
            extra = {"debris": prepared.debris.record()} if prepared.debris else {}
            sink.write(run_record(req, launcher.kind, {
                "striping": prepared.striping, "restore_shift": shift,
                "intra_op_threads": intra_op.record(), **topo.extra,
                "clock": topo.clock, **extra}))
            sink.flush()
        try:
            launcher.run(req, topo, sink, on_progress)
        except RunFailed as exc:
            failure = exc
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (runner.signals)
            if sink is not None:
                sink.write(ErrorRecord(0, "run", "interrupted", f"stopped by {signal_name(exc)}"))
            raise
        end = launcher.end_clock(topo)
        if sink is not None:
            if end is not None:
                sink.write(end)
            sink.write(startup_record(*launcher.ranks_set_up(), len(topo.groups)))
            sink.flush()
        launcher.barrier()
        clean = failure is None
    finally:
        if lease is not None:
            lease.stop()
        tiers = req.options.tiers
        if launcher.kind == "local" and tiers.enabled and not tiers.keep:  # processes gone
            remove_run_copies(req.options.tiers.memory_dir, names.run_id)
        if launcher.root:
            if not clean:  # bounded from here; after a stall, one short try (the budget)
                req.backend.cleaning_up(failure is not None and failure.kind == "stall")
            _finish(req, names, clean, sink, notice)
        launcher.barrier()
        req.backend.release()
    return failure
