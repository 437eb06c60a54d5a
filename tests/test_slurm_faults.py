"""Faults under a real Slurm (the session's cluster of two emulated nodes, 2 ranks each):
a rank killed, a node's slurmd and all its processes killed, `scancel`, a time limit,
each in the middle of a save.

Each ends the run in bounded time, ckptbench says so in one line (MPI rank 0: by which
signal, the Slurm job and step, what stays on the target), no manifest is committed, no
process of the job is left on any node, and the next run on the target removes the
partial checkpoint with --clean-debris. The tests wait for states (a flag file the
paused rank writes, the job's processes gone), never for fixed times.
"""

from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import processes
from harness.slurm import MPI_PLUGIN, unavailable

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "workloads" / "tiny.toml"
FAULT_RUN = ROOT / "tests" / "runner" / "fault_run.py"
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "slurmctld:")
pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]


@pytest.fixture
def cluster(slurm):
    """The session's cluster with both nodes idle before and after the test (a node
    killed by a test gets its slurmd back)."""
    slurm.wait_nodes("idle", timeout=60)
    yield slurm
    for name in slurm.names:
        if f"slurmd-{name}" not in slurm.procs:
            slurm.start_node(name)
    slurm.wait_nodes("idle", timeout=60)


def start_run(slurm, tmp: Path, faults: list[str], *srun: str) -> subprocess.Popen[str]:
    """`srun -N 2 --ntasks-per-node=2 ... ckptbench run tiny` through tests' fault_run."""
    return processes.start(
        ["srun", "-N", "2", "--ntasks-per-node=2", f"--mpi={MPI_PLUGIN}",
         "--kill-on-bad-exit=1", *srun, sys.executable, str(FAULT_RUN), *faults, "--",
         str(TINY), "--target", str(tmp / "t"), "--results", str(tmp / "r.jsonl"),
         "--block-size", "1MiB", "--stall-timeout", "600s"],
        env=slurm.env(PYTHONPATH=str(ROOT)))


def paused(proc: subprocess.Popen[str], tmp: Path, within: float = 120) -> None:
    """Until plan rank 2 (on node n2) is stuck in the middle of its file."""
    deadline = time.monotonic() + within
    while not glob.glob(str(tmp / "paused.*")):
        assert proc.poll() is None, f"the run ended before the fault: {proc.communicate()}"
        assert time.monotonic() < deadline, "rank 2 did not reach the pause"
        time.sleep(0.05)


PAUSE = ["--pause-file", "/__2_", "--pause-after", "2000000"]


def ended(proc: subprocess.Popen[str], within: float) -> tuple[str, float]:
    """The run's stderr once srun has returned (a failure if not within `within` s)."""
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        processes.stop(proc)
        pytest.fail(f"srun did not end within {within} s of the fault")
    assert proc.returncode != 0
    return err, time.monotonic() - t0


def job_processes_gone(slurm, within: float = 30) -> None:
    """Until no process of the job (slurmstepd, a rank) is left on any node."""
    deadline = time.monotonic() + within
    while left := {p: a for p, a in slurm.processes().items() if not a.startswith(DAEMONS)}:
        assert time.monotonic() < deadline, f"left on the nodes: {left}"
        time.sleep(0.1)


def check_the_end(slurm, tmp: Path, err: str, clean: bool = True) -> None:
    """One line, nothing committed, nothing left running; with `clean`, the next run
    removes the debris (the intent record is there otherwise)."""
    lines = [line for line in err.splitlines() if line.startswith("ckptbench: error:")]
    assert len(lines) == 1, err
    assert "stopped by SIGTERM (Slurm job " in lines[0] and str(tmp / "t") in lines[0]
    assert not list((tmp / "t").rglob(".metadata"))  # nothing committed
    job_processes_gone(slurm)
    assert list((tmp / "t").glob("run-*/.ckptbench-run"))
    if not clean:
        return
    # The next run on the target finds the partial checkpoint and removes it by its names.
    done = subprocess.run([sys.executable, "-m", "ckptbench", "run", str(TINY), "--target",
                           str(tmp / "t"), "--results", str(tmp / "next.jsonl"),
                           "--clean-debris", "--no-restore"],
                          capture_output=True, text=True, timeout=300,
                          env={**slurm.env(), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    run = json.loads((tmp / "next.jsonl").read_text().splitlines()[0])
    assert run["debris"]["removed"] and run["debris"]["left"] == []
    assert not (tmp / "t").exists()  # made by the first run: removed with its last run


def test_a_rank_killed_mid_save_ends_the_step(cluster, tmp_path):
    proc = start_run(cluster, tmp_path, ["--die-file", "/__1_", "--die-after", "2000000"])
    err, _ = ended(proc, within=120)
    assert "task 1: Exited with exit code 9" in err
    check_the_end(cluster, tmp_path, err, clean=False)


def test_scancel_mid_save_ends_the_run(cluster, tmp_path):
    proc = start_run(cluster, tmp_path, [*PAUSE, "--pause-flag", str(tmp_path / "paused")])
    paused(proc, tmp_path)
    (job,) = cluster.run("squeue", "-h", "-o", "%i", timeout=30).stdout.split()
    assert cluster.run("scancel", job, timeout=30).returncode == 0
    err, _ = ended(proc, within=60)
    check_the_end(cluster, tmp_path, err)
    assert cluster.wait_job(job, timeout=60) == "CANCELLED"


def test_a_node_killed_mid_save_ends_the_run(cluster, tmp_path):
    """slurmd of n2, its slurmstepd and its ranks SIGKILLed at once: Slurm finds the node
    not responding (SlurmdTimeout) and ends the job; rank 0 on n1 says so."""
    proc = start_run(cluster, tmp_path, [*PAUSE, "--pause-flag", str(tmp_path / "paused")])
    paused(proc, tmp_path)
    (job,) = cluster.run("squeue", "-h", "-o", "%i", timeout=30).stdout.split()
    killed = cluster.kill_node("n2")
    assert len(killed) >= 4  # slurmd, slurmstepd, ranks 2 and 3
    err, _ = ended(proc, within=120)
    assert "Node failure on n2" in err
    check_the_end(cluster, tmp_path, err)
    assert cluster.wait_job(job, timeout=60) == "NODE_FAIL"


def test_a_time_limit_mid_save_ends_the_run(cluster, tmp_path):
    """--time=1 (Slurm's limits are whole minutes): the step is ended past it."""
    proc = start_run(cluster, tmp_path, [*PAUSE, "--pause-flag", str(tmp_path / "paused")],
                     "--time=1")
    paused(proc, tmp_path)
    (job,) = cluster.run("squeue", "-h", "-o", "%i", timeout=30).stdout.split()
    err, _ = ended(proc, within=180)
    assert "DUE TO TIME LIMIT" in err
    check_the_end(cluster, tmp_path, err, clean=False)
    assert cluster.wait_job(job, timeout=60) == "TIMEOUT"
