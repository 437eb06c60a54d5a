"""MPI ranks as the processes of a run: ``mpirun -np N`` / ``srun`` with mpi4py.

Each MPI process runs a contiguous group of the plan ranks (one each when the world is
as large as the plan). MPI process 0 is the coordinator: it prepares the target, writes
the results file and prints; the others print nothing. The lifecycle is the session's
(:mod:`ckptbench.runner.session`) and the collective loop the same as with local
processes (:func:`ckptbench.runner.driver.run_iterations`).

Clocks: each node's offset to process 0's ``perf_counter_ns`` is measured by its lowest
MPI rank with a ping-pong (the round with the smallest round trip wins, Cristian's
method) and shared by every process of the node, which reads the same CLOCK_MONOTONIC.
The offsets are measured before the run and again after it (the difference is the
drift), and recorded per node. Each phase starts behind a barrier.

Failure: an error inside a phase is gathered and decided together (the driver). A
process that raises anything else reports it and calls MPI_Abort; a process that dies
makes mpirun end the job (Open MPI does for a non-zero exit; with Slurm use
``srun --kill-on-bad-exit=1``). A rank that is alive but moves no byte (stopped
included) is found by the stall watch and reported through process 0, which records it
and ends the job (runner.watch_mpi). Nothing waits forever on a dead peer.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ckptbench.errors import CkptbenchError, RunFailed, SpecError, describe_error
from ckptbench.formats.base import from_root, now
from ckptbench.records import ClockRecord, JsonlSink
from ckptbench.runner.comm import Comm, T
from ckptbench.runner.driver import run_iterations
from ckptbench.runner.options import RunRequest
from ckptbench.runner.scheduler import node_name, placement, process_facts, step_facts
from ckptbench.runner.session import Launcher, Progress, Topology
from ckptbench.runner.watch_mpi import Inbox, stop_guard, watch_this_rank

# Environment variables that say "started by an MPI launcher", with the world size.
SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")
RANK_VARS = ("PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
CLOCK_ROUNDS = 16
_CLOCK_TAG = 7301


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


class MPIComm(Comm):
    """Comm over an mpi4py communicator (COMM_WORLD by default)."""

    kind = "mpi"

    def __init__(self, comm: Any = None, hosts: list[str] | None = None,
                 subset: bool = False) -> None:
        """`hosts`: a host name per MPI rank instead of the real ones (tests exercise the
        multi-node paths on one machine through it); `subset`: `comm` holds some of the
        launcher's processes (a sweep's point), not all it started."""
        import mpi4py

        fresh = "mpi4py.MPI" not in sys.modules
        if fresh:  # only the main thread talks to MPI
            mpi4py.rc.thread_level = "funneled"
        began = time.perf_counter()
        from mpi4py import MPI  # MPI_Init_thread here, when fresh

        # what MPI's initialisation took in this process (None: done before we came)
        self.init_s = time.perf_counter() - began if fresh else None

        self.MPI = MPI
        self.c = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.c.Get_rank()
        self.size = self.c.Get_size()
        self._offset = 0
        self._host = hosts[self.rank] if hosts and len(hosts) == self.size else node_name()
        self.subset = subset

    def barrier(self) -> None:
        self.c.Barrier()

    def gather(self, obj: T) -> list[T] | None:
        out: list[T] | None = self.c.gather(obj, root=0)
        return out

    def bcast(self, obj: T) -> T:
        out: T = self.c.bcast(obj, root=0)
        return out

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
        table: list[dict[str, Any]] | None = None
        if self.rank == 0:
            assert estimates is not None
            table = [{"host": h, "processes": [p for p, x in enumerate(hosts) if x == h],
                      "clock_offset_ns": estimates[leader][0],
                      "clock_rtt_ns": estimates[leader][1]} for h, leader in leaders.items()]
        nodes = from_root(self, table)
        if apply:
            self._offset = next(n["clock_offset_ns"] for n in nodes if n["host"] == self._host)
        return nodes


class MPILauncher(Launcher):
    """This process is one MPI rank of the run."""

    kind = "mpi"
    prepares_everywhere = True

    def __init__(self, comm: MPIComm) -> None:
        self.comm = comm
        self.root = comm.rank == 0
        self._nodes: list[dict[str, Any]] = []
        self._init_s: float | None = None

    def topology(self, req: RunRequest) -> Topology:
        comm, ranks = self.comm, req.ranks
        env_size = launched_size()
        if comm.size == 1 and env_size and env_size[1] and env_size[1] > 1 and not comm.subset:
            raise SpecError(
                f"MPI sees 1 process but the launcher started {env_size[1]} ({env_size[0]}): "
                "mpi4py's MPI library does not speak this launcher's protocol (with Slurm try "
                "srun --mpi=pmix or --mpi=pmi2)")
        groups = split_ranks(ranks, comm.size)
        run_id = comm.bcast(req.options.run_id)
        places = comm.allgather({**process_facts(), "node": comm.host()})
        inits = comm.gather(comm.init_s)
        if inits is not None and all(t is not None for t in inits):
            self._init_s = max(t for t in inits if t is not None)
        nodes = comm.measure_clock()
        host_of_process = {p: n["host"] for n in nodes for p in n["processes"]}
        for node in nodes:
            node["plan_ranks"] = [r for p in node["processes"] for r in groups[p]]
        self._nodes = nodes
        return Topology(
            run_id, groups, [host_of_process[p] for p in range(comm.size)],
            {"method": "ping-pong to MPI rank 0, min round trip per node",
             "rounds": CLOCK_ROUNDS, "nodes": nodes},
            {"mpi": {"world_size": comm.size, "nodes": len(nodes), "groups": groups,
                     "threads_per_process": [max(1, req.options.threads) * len(g)
                                             for g in groups]},
             **_scheduler(places, groups)})

    def agree(self, error: BaseException | None, where: str) -> None:
        """Collective: raise on every process if any process had an error (process 0
        names the first one and its host)."""
        comm = self.comm
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
            if comm.rank == 0 and error is not None and isinstance(error, CkptbenchError):
                raise error
            raise RunFailed(first[1], first[0])

    def run(self, req: RunRequest, topo: Topology, sink: JsonlSink | None,
            progress: Progress | None) -> None:
        comm = self.comm
        mine = topo.groups[comm.rank]
        scaled = None
        if self.root and progress is not None:
            rank_bytes = req.plan.rank_bytes()
            my_bytes = int(sum(int(rank_bytes[r]) for r in mine))
            total = int(sum(int(rank_bytes[r]) for r in req.ranks))
            factor = total / my_bytes if my_bytes else 0.0
            if factor:
                def scaled(k: int) -> None:
                    progress(int(k * factor))
        timeout = req.options.stall_timeout
        inbox = Inbox(sink) if self.root and timeout > 0 else None
        address = comm.bcast(inbox.address if inbox is not None else None)
        watch, tick, guard = watch_this_rank(timeout, address,
                                             f"MPI rank {comm.rank} on {comm.host()}")

        def moved(n: int) -> None:
            tick(n)
            if scaled is not None:
                scaled(n)

        try:
            run_iterations(req.plan, mine, req.ranks, req.backend, comm, req.options, sink,
                           moved, watch, req.names)
        except RunFailed:
            raise
        except BaseException as exc:
            _die(comm, exc)
            raise
        finally:
            stop_guard(guard)
            if inbox is not None:
                inbox.close()

    def end_clock(self, topo: Topology) -> ClockRecord | None:
        if topo.nodes <= 1:
            return None
        end_nodes = self.comm.measure_clock(apply=False)
        start = {n["host"]: n["clock_offset_ns"] for n in self._nodes}
        return ClockRecord("end", [{**n, "drift_ns": n["clock_offset_ns"] - start[n["host"]]}
                                   for n in end_nodes])

    def barrier(self) -> None:
        self.comm.barrier()

    def ranks_set_up(self) -> tuple[float | None, str]:
        return self._init_s, f"MPI initialisation, the slowest of {self.comm.size} ranks"

    def share(self, value: Any) -> Any:
        return self.comm.bcast(value)

    def per_node(self, k: int) -> tuple[Launcher | None, int]:
        comm = self.comm
        hosts = comm.allgather(comm.host())
        nodes = list(dict.fromkeys(hosts))
        fewest = min(nodes, key=hosts.count)
        if hosts.count(fewest) < k:
            raise SpecError(f"--ranks-per-node {k}: the launcher started {hosts.count(fewest)} "
                            f"process(es) on node {fewest}; allowed: at most the processes of "
                            f"each node (e.g. srun --ntasks-per-node={k})")
        inside = hosts[:comm.rank].count(comm.host()) < k
        sub = comm.c.Split(0 if inside else comm.MPI.UNDEFINED, comm.rank)
        if not inside:
            return None, len(nodes)
        return MPILauncher(MPIComm(sub, [hosts[p] for p in range(comm.size)
                                         if hosts[:p].count(hosts[p]) < k], subset=True)
                           ), len(nodes)

    def idle_barrier(self) -> None:
        pending = self.comm.c.Ibarrier()
        while not pending.Test():
            time.sleep(0.02)


def _scheduler(places: list[dict[str, Any]], groups: list[list[int]]) -> dict[str, Any]:
    """The run record's `scheduler` entry (Slurm's job, step and placement), if any."""
    found = placement(step_facts(), places, groups)
    return {"scheduler": found} if found else {}


def _die(comm: MPIComm, exc: BaseException) -> None:
    """Report an error that left the collective loop, then stop the whole job."""
    kind, message = describe_error(exc)
    sys.stderr.write(f"ckptbench: error: MPI rank {comm.rank} on {comm.host()}: {message}\n")
    sys.stderr.flush()
    comm.abort(2 if kind == "backend" else 1)
