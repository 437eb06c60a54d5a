"""MPI ranks as the processes of a run: ``mpirun -np N`` / ``srun`` with mpi4py.

Each MPI process runs a contiguous group of the plan ranks (one each when the world is
as large as the plan). MPI process 0 is the coordinator: it prepares the target, writes
the results file and prints; the others print nothing. The collective loop is the same
as with local processes (:func:`ckptbench.runner.driver.run_iterations`).

Clocks: each node's offset to process 0's ``perf_counter_ns`` is measured by its lowest
MPI rank with a ping-pong (the round with the smallest round trip wins, Cristian's
method) and shared by every process of the node, which reads the same CLOCK_MONOTONIC.
The offsets are measured before the run and again after it (the difference is the
drift), and recorded per node. Each phase starts behind a barrier.

Failure: an error inside a phase is gathered and decided together (the driver). A
process that raises anything else reports it and calls MPI_Abort; a process that dies
makes mpirun end the job (Open MPI does for a non-zero exit; with Slurm use
``srun --kill-on-bad-exit=1``). Nothing waits forever on a dead peer.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError, SpecError
from ckptbench.runner.comm import Comm
from ckptbench.runner.engine import describe_error, now

# Environment variables that say "started by an MPI launcher", with the world size.
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
RANK_VARS = ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
CLOCK_ROUNDS = 16
_CLOCK_TAG = 7301
# Test only: comma-separated host names by MPI rank, to exercise multi-node paths
# (clock ping-pong, restore shift, shared-target check) on one machine.
TEST_HOSTS_ENV = "CKPTBENCH_TEST_HOSTS"


def launched_size(environ: Mapping[str, str] | None = None) -> tuple[str, int | None] | None:
    """(variable, world size) when the environment says an MPI launcher started us; the
    size is None when only a rank is known (PMIx). None when not launched by MPI."""
    env = os.environ if environ is None else environ
    for var in SIZE_VARS:
        if var in env:
            try:
                return var, int(env[var])
            except ValueError:
                continue
    for var in RANK_VARS:
        if var in env:
            return var, None
    return None


def mpi4py_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mpi4py") is not None


def choose_launcher(choice: str, environ: Mapping[str, str] | None = None,
                    have_mpi4py: bool | None = None) -> str:
    """'local' or 'mpi' for --launcher auto|local|mpi; a one-line error when MPI is asked
    for (or detected, with more than one process) and mpi4py is missing."""
    if choice == "local":
        return "local"
    have = mpi4py_available() if have_mpi4py is None else have_mpi4py
    install = "install it with: pip install 'ckptbench[mpi]'"
    if choice == "mpi":
        if not have:
            raise SpecError(f"--launcher mpi needs mpi4py; {install}")
        return "mpi"
    if choice != "auto":
        raise SpecError(f"--launcher {choice!r} is not allowed; allowed: auto, local, mpi")
    found = launched_size(environ)
    if found is None:
        return "local"
    var, size = found
    if size is not None and size <= 1:
        return "local"  # one task: local processes run every rank better than one MPI rank
    if not have:
        raise SpecError(
            f"started by an MPI launcher ({var}={size if size is not None else 'set'}) but "
            f"mpi4py is not installed; {install}, or pass --launcher local to run all the "
            "ranks in each process")
    return "mpi"


def split_ranks(ranks: list[int], size: int) -> list[list[int]]:
    """Contiguous groups of plan ranks, one per MPI process, sizes differing by at most one."""
    if size > len(ranks):
        raise SpecError(
            f"the MPI launcher started {size} processes but the run has {len(ranks)} plan "
            f"ranks; allowed: at most {len(ranks)} processes (one or more plan ranks each)")
    base, extra = divmod(len(ranks), size)
    out, start = [], 0
    for p in range(size):
        n = base + (1 if p < extra else 0)
        out.append(list(ranks[start:start + n]))
        start += n
    return out


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


class MPIComm(Comm):
    """Comm over an mpi4py communicator (COMM_WORLD by default)."""

    kind = "mpi"

    def __init__(self, comm: Any = None) -> None:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules:  # only the main thread talks to MPI
            mpi4py.rc.thread_level = "funneled"
        from mpi4py import MPI

        self.MPI = MPI
        self.c = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.c.Get_rank()
        self.size = self.c.Get_size()
        self._offset = 0
        fake = os.environ.get(TEST_HOSTS_ENV)
        names = fake.split(",") if fake else []
        self._host = names[self.rank] if len(names) == self.size else socket.gethostname()

    def barrier(self) -> None:
        self.c.Barrier()

    def gather(self, obj: Any) -> list[Any] | None:
        return self.c.gather(obj, root=0)

    def bcast(self, obj: Any) -> Any:
        return self.c.bcast(obj, root=0)

    def allgather(self, obj: Any) -> list[Any]:
        return self.c.allgather(obj)

    def host(self) -> str:
        return self._host

    def clock_offset_ns(self) -> int:
        return self._offset

    def abort(self, code: int = 1) -> None:
        self.c.Abort(code)

    # --- clocks ---
    def _ping(self, rounds: int) -> tuple[int, int]:
        buf = np.zeros(1, dtype=np.int64)
        best = (0, -1)
        for _ in range(rounds):
            t0 = now()
            self.c.Send(buf, dest=0, tag=_CLOCK_TAG)
            self.c.Recv(buf, source=0, tag=_CLOCK_TAG)
            t1 = now()
            if best[1] < 0 or t1 - t0 < best[1]:
                best = (int(buf[0]) - (t0 + t1) // 2, t1 - t0)
        return best

    def _serve(self, peer: int, rounds: int) -> None:
        buf = np.zeros(1, dtype=np.int64)
        for _ in range(rounds):
            self.c.Recv(buf, source=peer, tag=_CLOCK_TAG)
            buf[0] = now()
            self.c.Send(buf, dest=peer, tag=_CLOCK_TAG)

    def measure_clock(self, rounds: int = CLOCK_ROUNDS, apply: bool = True) -> list[dict[str, Any]]:
        """Collective: each node's offset to process 0's clock, measured by the node's
        lowest rank; returns the per-node table on every process (and uses it when
        `apply`)."""
        hosts = self.allgather(self._host)
        leaders: dict[str, int] = {}
        for p, h in enumerate(hosts):
            leaders.setdefault(h, p)
        self.barrier()
        estimate = (0, 0)
        for h, leader in leaders.items():
            if h == hosts[0]:
                continue
            if self.rank == 0:
                self._serve(leader, rounds)
            elif self.rank == leader:
                estimate = self._ping(rounds)
        estimates = self.gather(estimate)
        table = None
        if self.rank == 0:
            assert estimates is not None
            table = [{"host": h, "processes": [p for p, x in enumerate(hosts) if x == h],
                      "clock_offset_ns": estimates[leader][0],
                      "clock_rtt_ns": estimates[leader][1]} for h, leader in leaders.items()]
        table = self.bcast(table)
        if apply:
            self._offset = next(n["clock_offset_ns"] for n in table if n["host"] == self._host)
        return table


def _agree(comm: MPIComm, error: BaseException | None, where: str) -> None:
    """Collective: raise on every process if any process had an error (process 0 names
    the first one and its host)."""
    mine = None
    if error is not None:
        kind, message = describe_error(error)
        mine = (kind, f"{message} (MPI rank {comm.rank} on {comm.host()}, {where})"
                if comm.rank else message)
    reports = comm.gather(mine)
    first = None
    if comm.rank == 0:
        assert reports is not None
        first = next((r for r in reports if r is not None), None)
    first = comm.bcast(first)
    if first is not None:
        from ckptbench.runner.driver import RunFailed

        if comm.rank == 0 and mine is not None and isinstance(error, CkptbenchError):
            raise error
        raise RunFailed(first[1], first[0])


def _die(comm: MPIComm, exc: BaseException) -> None:
    """Report an error that left the collective loop, then stop the whole job."""
    kind, message = describe_error(exc)
    sys.stderr.write(f"ckptbench: error: MPI rank {comm.rank} on {comm.host()}: {message}\n")
    sys.stderr.flush()
    comm.abort(2 if kind == "backend" else 1)


def run_mpi(req: Any, backend: Backend, comm: MPIComm,
            on_progress: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None) -> list[dict[str, Any]] | None:
    """Run `req` as this MPI process's share; process 0 returns the summary records."""
    from ckptbench.records import ResultsWriter, read_records
    from ckptbench.report import summarize
    from ckptbench.runner import run_record, striping_record
    from ckptbench.runner.driver import RunFailed, run_iterations

    env_size = launched_size()
    if comm.size == 1 and env_size and env_size[1] and env_size[1] > 1:
        raise SpecError(
            f"MPI sees 1 process but the launcher started {env_size[1]} ({env_size[0]}): "
            "mpi4py's MPI library does not speak this launcher's protocol (with Slurm try "
            "srun --mpi=pmix or --mpi=pmi2)")
    root = comm.rank == 0
    plan, ranks = req.plan, req.ranks
    groups = split_ranks(ranks, comm.size)
    mine = groups[comm.rank]
    run_id = comm.bcast(req.options.run_id)
    nodes = comm.measure_clock()
    host_of_process = {p: n["host"] for n in nodes for p in n["processes"]}
    position_hosts = [host_of_process[p] for p, g in enumerate(groups) for _ in g]
    if req.restore_shift_auto:
        shift, own = auto_restore_shift(position_hosts)
        source = "auto: one node" if len(nodes) == 1 else "auto: plan ranks per node"
    else:
        shift = req.options.restore_shift
        hosts_arr = np.array(position_hosts)
        own = int(np.count_nonzero(hosts_arr == np.roll(hosts_arr, -(shift % len(ranks)))))
        source = "option"
    options = replace(req.options, run_id=run_id, restore_shift=shift)
    req = replace(req, options=options)
    for node in nodes:
        node["plan_ranks"] = [r for p in node["processes"] for r in groups[p]]

    # --- setup: process 0 first (target, results file, striping), then the others ---
    writer = ResultsWriter(req.results) if root else None
    error: BaseException | None = None
    striping: dict[str, Any] = {}
    probe = f"{run_id}/.ckptbench-probe"
    multi_node = len(nodes) > 1
    prepared = writer_opened = False
    try:
        if root:
            try:
                assert writer is not None
                writer.open()
                writer_opened = True
                backend.prepare()
                prepared = True
                striping = striping_record(backend, plan, run_id)
                if multi_node:
                    backend.put_atomic(probe, comm.host().encode())
            except BaseException as exc:  # noqa: BLE001 - agreed on below
                error = exc
        _agree(comm, error, "preparing the target")
        if not root:
            try:
                backend.prepare()
                if multi_node and not backend.exists(probe):
                    raise CkptbenchError(
                        f"target {backend.target} is not shared with {nodes[0]['host']} (rank 0 "
                        "wrote a file there that this node does not see); allowed: a file "
                        "system or object store every node reaches")
            except BaseException as exc:  # noqa: BLE001
                error = exc
        _agree(comm, error, "checking the target")
    except BaseException:
        if writer is not None:
            writer.close()
            if writer_opened:
                req.results.unlink(missing_ok=True)  # nothing ran: no results file
        if prepared:
            backend.remove_tree(run_id)
        backend.release()
        raise
    if root and multi_node:
        backend.remove_tree(probe)
    if root and on_start:
        on_start()

    failure: RunFailed | None = None
    summary: list[dict[str, Any]] | None = None
    try:
        if root:
            assert writer is not None
            writer.write(run_record(req, "mpi", {
                "striping": striping,
                "restore_shift": {"value": shift, "source": source, "own_node_reads": own},
                "mpi": {"world_size": comm.size, "nodes": len(nodes),
                        "groups": groups, "threads_per_process": [
                            max(1, options.threads) * len(g) for g in groups]},
                "clock": {"method": "ping-pong to MPI rank 0, min round trip per node",
                          "rounds": CLOCK_ROUNDS, "nodes": nodes},
            }))
            writer.flush()
        progress = None
        if root and on_progress is not None:
            rank_bytes = plan.rank_bytes()
            my_bytes = int(sum(int(rank_bytes[r]) for r in mine))
            total = int(sum(int(rank_bytes[r]) for r in ranks))
            scale = total / my_bytes if my_bytes else 0.0
            progress = (lambda k: on_progress(int(k * scale))) if scale else None  # noqa: E731
        try:
            run_iterations(plan, mine, ranks, backend, comm, options, writer, progress)
        except RunFailed as exc:
            failure = exc
        except BaseException as exc:  # noqa: BLE001 - not a collective decision: stop all
            _die(comm, exc)
            raise
        end_nodes = comm.measure_clock(apply=False) if multi_node else None
        if root:
            assert writer is not None
            if end_nodes is not None:
                start = {n["host"]: n["clock_offset_ns"] for n in nodes}
                writer.write({"type": "clock", "when": "end", "nodes": [
                    {**n, "drift_ns": n["clock_offset_ns"] - start[n["host"]]}
                    for n in end_nodes]})
            writer.flush()
            summary = summarize(list(read_records(req.results)))
            writer.write_all(summary)
        comm.barrier()
    finally:
        if writer is not None:
            writer.close()
    if root and not options.keep:
        backend.remove_tree(run_id)
    comm.barrier()
    backend.release()
    if failure is not None:
        raise failure
    return summary
