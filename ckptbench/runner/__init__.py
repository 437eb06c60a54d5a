"""Executing a plan: a session (one lifecycle) on local processes or MPI ranks.

* :mod:`.options`: what a run is asked to do (RunOptions, RunRequest);
* :mod:`.session`: the lifecycle and the Launcher seam;
* :mod:`.launch_local` / :mod:`.launch_mpi`: the two launchers;
* :mod:`.driver`: the collective iteration loop every process runs;
* :mod:`.comm`: the rank-to-rank operations the loop needs.
"""

from __future__ import annotations

from ckptbench.errors import SpecError
from ckptbench.runner.options import RunOptions, RunRequest, new_run_id
from ckptbench.runner.session import Launcher, run_session

__all__ = ["Launcher", "RunOptions", "RunRequest", "new_run_id", "open_launcher", "run_session"]


def open_launcher(choice: str = "auto") -> Launcher:
    """--launcher auto|local|mpi -> a Launcher; under MPI this initializes MPI."""
    from ckptbench.runner.launch_mpi import MPIComm, MPILauncher, choose_launcher
    from ckptbench.runner.signals import exit_on_signals

    if choice not in ("auto", "local", "mpi"):
        raise SpecError(f"--launcher {choice!r} is not allowed; allowed: auto, local, mpi")
    if choose_launcher(choice) == "local":
        from ckptbench.runner.launch_local import LocalLauncher

        return LocalLauncher()
    exit_on_signals()  # an MPI rank cannot clean up: it ends at once
    return MPILauncher(MPIComm())
