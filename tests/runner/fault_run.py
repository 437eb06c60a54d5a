"""`ckptbench run` with faults injected through the library's seams (tests only).

    python tests/runner/fault_run.py [--die-file SUBSTRING --die-after BYTES]
                                     [--full-file SUBSTRING --full-after BYTES]
                                     [--pause-file SUBSTRING --pause-after BYTES
                                      --pause-flag PATH] [--hosts a,a,b,b] -- RUN ARGS...

--die-file: the process writing a key containing SUBSTRING exits (status 9) once it has
written BYTES of such keys. --full-file: writes to such keys fail with ENOSPC once BYTES
of them were written (a disk filling up). --pause-file: the process writing such keys
creates PATH.<pid> once it has written BYTES of them, then blocks. --hosts: under MPI, a host name per MPI rank
instead of the real one (multi-node paths on one machine). All wrap what the CLI builds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ckptbench import measure
from ckptbench.cli import main, run_cmd
from ckptbench.testing.faults import DyingBackend, FullDiskBackend, PausingBackend


def install(die_file: str | None, die_after: int, hosts: list[str] | None,
            full_file: str | None = None, full_after: int = 0,
            pause: tuple[str, int, str] | None = None) -> None:
    if die_file or full_file or pause:
        open_backend = measure.open_backend

        def faulty(*args: Any, **kwargs: Any) -> Any:
            backend = open_backend(*args, **kwargs)
            if pause:
                backend = PausingBackend(backend, lambda k: pause[0] in k, pause[1], pause[2])
            if full_file:
                backend = FullDiskBackend(backend, lambda k: full_file in k, full_after)
            if die_file:
                backend = DyingBackend(backend, lambda k: die_file in k, die_after)
            return backend

        measure.open_backend = faulty  # type: ignore[assignment]
    if hosts:
        from ckptbench.runner import launch_mpi

        def launcher(choice: str = "auto") -> Any:
            return launch_mpi.MPILauncher(launch_mpi.MPIComm(hosts=hosts))

        run_cmd.open_launcher = launcher  # type: ignore[assignment]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--die-file")
    ap.add_argument("--die-after", type=int, default=1)
    ap.add_argument("--full-file")
    ap.add_argument("--full-after", type=int, default=0)
    ap.add_argument("--pause-file")
    ap.add_argument("--pause-after", type=int, default=1)
    ap.add_argument("--pause-flag")
    ap.add_argument("--hosts")
    ap.add_argument("run_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    install(a.die_file, a.die_after, a.hosts.split(",") if a.hosts else None, a.full_file,
            a.full_after, (a.pause_file, a.pause_after, a.pause_flag) if a.pause_file else None)
    args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    sys.exit(main(["run", *args]))
