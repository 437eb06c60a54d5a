"""Never hang under mpirun (issue 29, family 6): a stalled MPI rank.

An MPI rank that is alive but moves no byte holds its peers in their next collective for
ever. Stopped (SIGSTOP) it cannot watch itself; blocked in a write it can, but only the
main thread may call MPI. Either way the stall watch (--stall-timeout) finds it, the job
ends in bounded time with one line naming the MPI rank, and process 0's results carry
an error record of kind ``stall`` (with the thread dump, where the rank could give one).
Each run starts in a session of its own and is killed whole if it outlives its bound.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .lifecycle import processes_mentioning
from .runs import SABOTAGE, TINY, env
from .test_hangs import STALL, _ended, _error_record, _one_error, kept

MPIRUN = shutil.which("mpirun")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
ASYNC = ("--mode", "async", "--step-seconds", "0.02", "--steps-per-checkpoint", "2")

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(MPIRUN is None or __import__("importlib").util.find_spec(
                  "mpi4py") is None, reason="needs mpirun and mpi4py")]
__all__ = ["kept"]  # the kept checkpoint the restore case reads (a fixture)


def _mpirun(action: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    assert MPIRUN is not None
    return subprocess.Popen([MPIRUN, "-np", "4", "--oversubscribe", sys.executable,
                             str(SABOTAGE), action, "--", *args], cwd=cwd,
                            env={**env(), **MPI_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize(("action", "loop"), [("stop:__1_", ()), ("stop:__1_", ASYNC),
                                              ("hang:__1_", ())],
                         ids=["stopped-sync", "stopped-async", "blocked-write-sync"])
def test_a_stalled_mpi_rank_ends_the_job_with_one_line_and_a_record(
        tmp_path: Path, action: str, loop: tuple[str, ...]) -> None:
    """MPI rank 1 stops (SIGSTOP) or blocks in a write after its first block: its guard
    (stopped) or its own watch (blocked) reports it to process 0, which records and ends."""
    target, results = tmp_path / "t", tmp_path / "r.jsonl"
    proc = _mpirun(action, str(TINY), "--target", str(target), *STALL, *loop, "--results",
                   str(results), cwd=tmp_path)
    err = _ended(proc, "MPI rank 1 stalled")
    line = _one_error(err, 1, proc, "MPI rank 1 on ", " stalled", "--stall-timeout 8s")
    error = _error_record(results)
    assert error["kind"] == "stall" and error["message"] == line.removeprefix(
        "ckptbench: error: ")
    if action.startswith("hang"):  # alive: it names the frame and the record has the dump
        assert "in _block (tests/adversarial/sabotage_run.py:" in line
        assert " in _block\n" in error["threads"] and " in write\n" in error["threads"]
    else:
        assert "(its process is stopped: SIGSTOP?)" in line
    assert processes_mentioning(str(target)) == []


def test_a_stopped_mpi_rank_fails_the_restore_command(kept: Path, tmp_path: Path) -> None:
    """`restore` under mpirun: MPI rank 1 stops while reading its own files (`files`: no
    other rank reads them); the kept checkpoint stays."""
    results = tmp_path / "r.jsonl"
    proc = _mpirun("stop-read:__1_", "restore", str(kept), "--restore-plan", "files", *STALL,
                   "--results", str(results), cwd=tmp_path)
    err = _ended(proc, "MPI rank 1 stopped reading")
    _one_error(err, 1, proc, "MPI rank 1 on ", " stalled", "--stall-timeout 8s")
    assert _error_record(results)["kind"] == "stall"
    assert processes_mentioning(str(kept)) == []
    assert (kept / ".metadata").exists()


def test_with_the_stall_timeout_off_a_rank_makes_no_watch() -> None:
    """--stall-timeout 0: no board or dump file (no descriptor opened), no guard process;
    on, the guard is a process of its own, ended by stop_guard."""
    import faulthandler
    import os

    from ckptbench.runner.thread_dump import DUMP_SIGNAL
    from ckptbench.runner.watch_mpi import stop_guard, watch_this_rank

    before = set(os.listdir("/proc/self/fd"))
    watch, tick, guard = watch_this_rank(0, None, "MPI rank 0")
    tick(1 << 20)
    assert guard is None and not watch.enabled
    assert set(os.listdir("/proc/self/fd")) == before
    watch, tick, guard = watch_this_rank(60, None, "MPI rank 0")
    try:
        tick(1 << 20)
        assert guard is not None and guard.poll() is None and watch.enabled
        assert len(set(os.listdir("/proc/self/fd")) - before) >= 2  # the board, the dump
    finally:
        stop_guard(guard)
        faulthandler.unregister(DUMP_SIGNAL)  # armed on this (the test's) process
    assert guard.returncode is not None
