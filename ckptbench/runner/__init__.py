"""Executing a plan: local processes by default, MPI ranks under mpirun/srun."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ckptbench.backends import Backend
from ckptbench.errors import CkptbenchError
from ckptbench.plan import Plan
from ckptbench.plan.export import summary as plan_summary
from ckptbench.plan.files import plan_layout
from ckptbench.records import SCHEMA, ResultsWriter, environment
from ckptbench.report import summarize
from ckptbench.runner.comm import Comm
from ckptbench.runner.engine import RunOptions
from ckptbench.spec import Workload

__all__ = ["Launch", "RunOptions", "RunRequest", "execute", "new_run_id", "open_launcher"]

# Test only: the process writing plan rank DIE_RANK's files exits with status 9 once it
# has written DIE_AFTER_BYTES bytes of them (a rank dying in the middle of a save).
TEST_DIE_RANK_ENV = "CKPTBENCH_TEST_DIE_RANK"
TEST_DIE_AFTER_ENV = "CKPTBENCH_TEST_DIE_AFTER_BYTES"


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


@dataclass(frozen=True)
class RunRequest:
    workload: Workload  # as written in the workload file (full size)
    plan: Plan  # of the workload as run (after --scale)
    ranks: list[int]
    backend: Backend
    options: RunOptions
    results: Path
    scale: int = 1
    # options.restore_shift was not given: 0 locally and on one node, the plan ranks per
    # node under MPI on several nodes (so no node reads back what it wrote).
    restore_shift_auto: bool = False


@dataclass
class Launch:
    """How this process takes part: 'local' (it forks the rank processes) or one MPI rank."""

    kind: str = "local"
    comm: Comm | None = None

    @property
    def root(self) -> bool:
        """Whether this process writes the results and prints (MPI rank 0, or local)."""
        return self.comm is None or self.comm.rank == 0

    @contextlib.contextmanager
    def quiet_unless_root(self) -> Iterator[None]:
        """On MPI ranks other than 0, an error rank 0 also reports ends the process with
        its exit status and no output (errors of one rank alone are printed where they
        happen, before the job is aborted)."""
        if self.root:
            yield
            return
        try:
            yield
        except CkptbenchError as exc:
            raise SystemExit(exc.exit_code) from None


def open_launcher(choice: str = "auto") -> Launch:
    """--launcher auto|local|mpi -> a Launch; under MPI this initializes MPI."""
    from ckptbench.runner.mpi import MPIComm, choose_launcher

    if choose_launcher(choice) == "local":
        return Launch()
    return Launch("mpi", MPIComm())


def run_record(req: RunRequest, launcher: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "type": "run",
        "schema": SCHEMA,
        "run_id": req.options.run_id,
        "launcher": launcher,
        "workload": req.workload.to_dict(),
        "scale": req.scale,
        "run_workload": req.plan.workload.to_dict(),
        "plan": plan_summary(req.plan),
        "ranks": req.ranks,
        "bytes_per_iteration": req.plan.bytes_of_ranks(req.ranks),
        "options": req.options.to_dict(),
        "environment": environment(req.backend.describe()),
        **(extra or {}),
    }


def striping_record(backend: Backend, plan: Plan, run_id: str) -> dict[str, Any]:
    """Apply the workload's striping hints to the run's directory where the backend can;
    say what was applied or why not."""
    ck = plan.workload.checkpoint
    base = {"stripe_size": ck.stripe_size, "stripe_count": ck.stripe_count, "applied": False}
    if ck.stripe_count == 0:
        return {**base, "reason": "not requested ([checkpoint] stripe_count = 0)"}
    return {**base, **backend.set_striping(run_id, ck.stripe_size, ck.stripe_count)}


def check_supported(plan: Plan, backend: Backend, restore: bool = False,
                    processes: int = 1) -> None:
    """Refuse, in one line, a run the backend cannot serve (file pattern, restores,
    processes), before anything is created."""
    backend.check_run(shared_file=plan.workload.checkpoint.files == "shared", restore=restore,
                      processes=processes)


def execute(req: RunRequest, on_progress: Callable[[int], None] | None = None,
            on_start: Callable[[], None] | None = None,
            launch: Launch | None = None) -> list[dict[str, Any]] | None:
    """Run locally (one process per plan rank) or as this MPI rank's share; return the
    summary records written (None on MPI ranks other than 0).

    `on_start` is called (on the process that reports) once the target and the results
    file are known to be usable.
    """
    launch = launch or Launch()
    processes = len(req.ranks) if launch.comm is None else min(launch.comm.size, len(req.ranks))
    check_supported(req.plan, req.backend, req.options.restore, processes)
    backend = with_test_hooks(req.backend, req.plan)
    if launch.kind == "mpi":
        from ckptbench.runner.mpi import MPIComm, run_mpi

        return run_mpi(req, backend, cast(MPIComm, launch.comm), on_progress, on_start)
    return _execute_local(req, backend, on_progress, on_start)


def _execute_local(req: RunRequest, backend: Backend, on_progress: Callable[[int], None] | None,
                   on_start: Callable[[], None] | None) -> list[dict[str, Any]]:
    from ckptbench.records import read_records
    from ckptbench.runner.local import run_local

    source = "auto: local processes (one node)" if req.restore_shift_auto else "option"
    writer = ResultsWriter(req.results)
    writer.open()
    try:
        backend.prepare()
    except BaseException:
        writer.close()
        req.results.unlink()
        raise
    if on_start:
        on_start()
    try:
        extra = {
            "striping": striping_record(backend, req.plan, req.options.run_id),
            "restore_shift": {"value": req.options.restore_shift, "source": source},
            "clock": {"method": "one host: all processes read the same CLOCK_MONOTONIC"},
        }
        writer.write(run_record(req, "local", extra))
        writer.flush()
        try:
            run_local(req.plan, req.ranks, backend, req.options, writer, on_progress)
        finally:
            writer.flush()
            summary = summarize(list(read_records(req.results)))
            writer.write_all(summary)
    finally:
        writer.close()
        if not req.options.keep:
            backend.remove_tree(req.options.run_id)
        backend.release()
    return summary


# --- test hooks (environment variables the tests set; never used otherwise) ---

class _DieAfterBytes:
    """A write handle that ends the process (status 9) once the budget is written."""

    def __init__(self, inner: Any, budget: list[int]) -> None:
        self._inner, self._budget = inner, budget

    def write(self, data: memoryview) -> None:
        self._inner.write(data)
        self._budget[0] -= len(data)
        if self._budget[0] <= 0:
            os._exit(9)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _DyingBackend:
    """Test-only backend wrapper: writes of one plan rank's files count against a budget."""

    def __init__(self, inner: Backend, plan: Plan, rank: int, after: int) -> None:
        layout = plan_layout(plan)
        self._inner = inner
        self._budget = [after]
        files = plan.files_of_rank(rank)
        self._paths = {plan.file_paths[f] for f in files if not layout.is_shared(plan.file_paths[f])}
        self._regions = {(plan.file_paths[f], int(layout.base[f])) for f in files
                         if layout.is_shared(plan.file_paths[f])}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @staticmethod
    def _path(key: str) -> str:
        return key.split("/", 2)[-1]  # run id / checkpoint dir / path in the checkpoint

    def open_write(self, key: str, size: int) -> Any:
        handle = self._inner.open_write(key, size)
        return _DieAfterBytes(handle, self._budget) if self._path(key) in self._paths else handle

    def open_write_region(self, key: str, offset: int, size: int, file_size: int) -> Any:
        handle = self._inner.open_write_region(key, offset, size, file_size)
        mine = (self._path(key), offset) in self._regions
        return _DieAfterBytes(handle, self._budget) if mine else handle


def with_test_hooks(backend: Backend, plan: Plan) -> Backend:
    rank = os.environ.get(TEST_DIE_RANK_ENV)
    if rank is None:
        return backend
    after = int(os.environ.get(TEST_DIE_AFTER_ENV, "1"))
    return cast(Backend, _DyingBackend(backend, plan, int(rank), after))
