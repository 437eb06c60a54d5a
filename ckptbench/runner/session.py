"""One run's lifecycle, whatever launches its processes.

results sink -> topology (which process runs which plan ranks, on which host, on whose
clock) -> the target prepared (process 0 first; under MPI every process checks it sees the
same target) -> striping -> the run record -> the iterations (runner.driver) on every
process -> the end clock -> cleanup of what the run created -> release.

A :class:`Launcher` supplies what differs between local processes and MPI ranks: the
topology, how the processes agree on an error, and how the iteration loop is started on
each of them. The caller owns the sink: it summarizes what the sink kept in memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError, RunFailed
from ckptbench.plan import Plan
from ckptbench.plan.export import restore_summary
from ckptbench.plan.export import summary as plan_summary
from ckptbench.plan.restore import restore_plan_of
from ckptbench.records import SCHEMA, ClockRecord, JsonlSink, environment
from ckptbench.runner.options import RunRequest
from ckptbench.runner.resources import check_options, resource_error

Progress = Callable[[int], None]


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
        """Run the iterations on every process; raise RunFailed when one failed."""

    def end_clock(self, topo: Topology) -> ClockRecord | None:
        """Collective: the clock offsets measured again after the run (the drift)."""
        return None

    def barrier(self) -> None:
        return None


def check_supported(plan: Plan, backend: Backend, restore: bool = False,
                    processes: int = 1) -> None:
    """Refuse, in one line, a run the backend cannot serve (before anything is created)."""
    backend.check_run(shared_file=plan.workload.checkpoint.files == "shared",
                      restore=restore, processes=processes)


def striping_record(backend: Backend, plan: Plan, run_id: str) -> dict[str, Any]:
    """Apply the workload's striping hints to the run's directory where the backend can;
    say what was applied or why not."""
    ck = plan.workload.checkpoint
    base = {"stripe_size": ck.stripe_size, "stripe_count": ck.stripe_count, "applied": False}
    if ck.stripe_count == 0:
        return {**base, "reason": "not requested ([checkpoint] stripe_count = 0)"}
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
        "environment": environment(req.backend.describe()),
        **extra,
    }


def _prepare(req: RunRequest, launcher: Launcher, topo: Topology,
             sink: JsonlSink | None) -> dict[str, Any]:
    """Collective: the results file and the target, process 0 first; the striping record.
    On failure everything done here is undone on the way out."""
    backend, run_id = req.backend, req.options.run_id
    probe = f"{run_id}/.ckptbench-probe"
    multi_node = topo.nodes > 1
    opened = prepared = False
    striping: dict[str, Any] = {}
    try:
        error: BaseException | None = None
        if launcher.root:
            try:
                if sink is not None:
                    sink.open()
                    opened = True
                backend.prepare()
                prepared = True
                striping = striping_record(backend, req.plan, run_id)
                if multi_node:
                    backend.put_atomic(probe, topo.hosts[0].encode())
            except BaseException as exc:
                error = exc
        launcher.agree(error, "preparing the target")
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
        if prepared:
            backend.remove_tree(run_id)
        backend.release()
        raise
    if launcher.root and multi_node:
        backend.remove_tree(probe)
    return striping


def run_session(req: RunRequest, launcher: Launcher, sink: JsonlSink | None,
                on_progress: Progress | None = None,
                on_start: Callable[[], None] | None = None) -> RunFailed | None:
    """Run `req` on `launcher`'s processes, records to `sink` (process 0's; None elsewhere).

    Returns the failure that stopped the run (its records are in the sink), or None. The
    sink stays open for the caller to append the summary; `on_start` is called on process
    0 once the target and the results file are known to be usable.
    """
    check_options(req)
    topo = launcher.topology(req)
    check_supported(req.plan, req.backend, req.options.restore, len(topo.groups))
    launcher.agree(resource_error(req, topo), "checking the memory the run needs")
    shift = restore_shift(req, topo, launcher.kind)
    req = replace(req, options=replace(req.options, run_id=topo.run_id,
                                       restore_shift=shift["value"]))
    striping = _prepare(req, launcher, topo, sink)
    if launcher.root and on_start:
        on_start()
    failure: RunFailed | None = None
    try:
        if sink is not None:
            sink.write(run_record(req, launcher.kind, {
                "striping": striping, "restore_shift": shift, **topo.extra,
                "clock": topo.clock}))
            sink.flush()
        try:
            launcher.run(req, topo, sink, on_progress)
        except RunFailed as exc:
            failure = exc
        end = launcher.end_clock(topo)
        if sink is not None:
            if end is not None:
                sink.write(end)
            sink.flush()
        launcher.barrier()
    finally:
        if launcher.root and not req.options.keep:
            req.backend.remove_tree(req.options.run_id)
        launcher.barrier()
        req.backend.release()
    return failure
